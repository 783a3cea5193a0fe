#!/usr/bin/env node
// A stand-in for `seedbar serve` for UI work without the engine: the /app routes of
// docs/app-api.md in memory, replies (and quick chat's chat/completions stream) made up from
// the seed, and dist/ served at /. Models whose name holds "think" (the library's "thinker")
// think first, as Qwen3 does: their replies stream a short reasoning before the answer.
// Remote engines are kept without a probe: a key "wrong" is refused (401), a URL holding
// "unreachable" cannot be reached (502); the rest are vLLM, whose seeds are not promised.
// `/app/catalogue` is a 16 GB Mac's; its Qwen3 4B GGUF (like any pull holding "offline") fails.
// Usage: node scripts/mock-server.mjs [--port 7338] [--api-key KEY] [--dir dist] [--model NAME]
//   --model: the default model quick chat asks (SmolLM2-135M-Instruct; `thinker` thinks)
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';

const args = process.argv.slice(2);
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i === -1 ? fallback : args[i + 1];
};
const port = Number(arg('--port', '7338'));
const apiKey = arg('--api-key', null);
const dir = arg('--dir', new URL('../dist', import.meta.url).pathname);
const defaultModel = arg('--model', 'SmolLM2-135M-Instruct');

const now = () => new Date().toISOString();
const defaults = { model: 'SmolLM2-135M-Instruct', system_prompt: '', temperature: 0.7, top_p: 1, max_tokens: 512, seed: null };
let nextId = 1;
const conversations = new Map();
const messages = new Map(); // conversation id -> Message[]
const models = [
  { name: 'SmolLM2-135M-Instruct', format: 'gguf', bytes: 105_000_000, quantization: 'Q4_1', architecture: 'llama', supported: true, loaded: true, memory_needed: 126000000, fits: true, capabilities: ['completion'] },
  { name: 'Qwen2.5-0.5B-Instruct-4bit', format: 'safetensors', bytes: 278_000_000, quantization: '4bit', architecture: 'qwen2', supported: true, loaded: false, memory_needed: 333600000, fits: true, capabilities: ['completion', 'tools'] },
  { name: 'thinker', format: 'safetensors', bytes: 1_200_000, quantization: null, architecture: 'qwen3', supported: true, loaded: false, memory_needed: 1440000, fits: true, capabilities: ['completion', 'tools', 'thinking'] },
];
const pulls = new Map();
const remotes = [];
let appSettings = {
  port: 7337, api_key: '', allowed_origins: [], show_in_dock: false, launch_at_login: false, quick_chat_shortcut: 'CommandOrControl+Shift+Space',
  prompt_cache_disk_gb: 8, unload_idle_minutes: 0, default_model: '', show_menu_bar_icon: true, start_minimized: false, welcomed: false,
  fetch_image_urls: false, draft_models: {},
};
/** The first run's catalogue as a 16 GB Mac sees it; a pull whose id holds "offline" fails. */
const catalogueFormat = (format, pull, gb, recommended = false) => ({
  format, pull, download_bytes: gb * 1e9, model_name: pull.includes(':') ? pull.split(':')[1].replace(/\.gguf$/, '') : pull.replace('/', '--'),
  memory_bytes: Math.round(gb * 1.2e9), fits: gb < 10, installed: false, recommended,
});
const catalogue = {
  memory_bytes: 16 * 2 ** 30, backend: 'metal', size_class: '3-4B',
  models: [
    { name: 'Qwen3 1.7B', family: 'qwen3', parameters_b: 1.7, size_class: '1-2B', architecture: 'qwen3', thinks: true, about: 'Thinks before it answers; good at code and maths for its size.',
      formats: [catalogueFormat('mlx-4bit', 'mlx-community/Qwen3-1.7B-4bit', 0.98), catalogueFormat('gguf-q4_k_m', 'unsloth/Qwen3-1.7B-GGUF:Qwen3-1.7B-Q4_K_M.gguf', 1.11)] },
    { name: 'Qwen3 4B', family: 'qwen3', parameters_b: 4, size_class: '3-4B', architecture: 'qwen3', thinks: true, about: 'Thinks before it answers; a strong all-rounder.',
      formats: [catalogueFormat('mlx-4bit', 'mlx-community/Qwen3-4B-4bit', 2.28, true), catalogueFormat('gguf-q4_k_m', 'offline/Qwen3-4B-GGUF:Qwen3-4B-Q4_K_M.gguf', 2.5)] },
    { name: 'Qwen3 8B', family: 'qwen3', parameters_b: 8.2, size_class: '7-9B', architecture: 'qwen3', thinks: true, about: 'The most capable here; needs a larger machine.',
      formats: [catalogueFormat('mlx-4bit', 'mlx-community/Qwen3-8B-4bit', 11)] },
  ],
};

const words = ['The', 'capital', 'of', 'France', 'is', 'Paris.', 'It', 'sits', 'on', 'the', 'Seine,', 'and', 'is', 'known', 'for', 'art,', 'food', 'and', 'the', 'Eiffel', 'Tower.'];
function replyFor(seed, history) {
  const last = history.filter((m) => m.role === 'user').at(-1)?.content ?? '';
  let x = seed % 2147483647 || 1;
  const rand = () => (x = (x * 48271) % 2147483647) / 2147483647;
  if (/code/i.test(last)) return 'Here is some code:\n\n```python\ndef greet(name):\n    return f"Hello, {name}!"  # a greeting\n```\n\nRun it with `python`.';
  const out = [];
  for (let i = 0; i < 14; i++) out.push(words[Math.floor(rand() * words.length)]);
  return `**Seed ${seed}**: ${out.join(' ')}`;
}

// What a thinking model mulls over first: markup in it must show as text, never as HTML.
function thoughtFor(seed, history) {
  const last = history.filter((m) => m.role === 'user').at(-1)?.content ?? '';
  return `The user asks <b>${JSON.stringify(last.slice(0, 40))}</b>.\nSeed ${seed} picks the words; a short answer will do.`;
}

/** A reply as the pieces it streams: the thinking first (models that think), then the answer. */
function replyPieces(model, seed, history) {
  const split = (text) => text.match(/\S+\s*|\s+/g) ?? [];
  const thinking = /think/i.test(model) ? split(thoughtFor(seed, history)) : [];
  return [
    ...thinking.map((text) => ({ kind: 'reasoning', text })),
    ...split(replyFor(seed, history)).map((text) => ({ kind: 'content', text })),
  ];
}

function send(res, status, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(body === undefined ? '' : JSON.stringify(body));
}
const fail = (res, status, message) => send(res, status, { error: { message, type: 'invalid_request_error', param: null, code: null } });

async function body(req) {
  let text = '';
  for await (const chunk of req) text += chunk;
  return text ? JSON.parse(text) : {};
}

function detail(id) {
  return { ...conversations.get(id), messages: messages.get(id) };
}

async function streamReply(req, res, id, input) {
  const conv = conversations.get(id);
  const list = messages.get(id);
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  const event = (e) => res.write(`data: ${JSON.stringify(e)}\n\n`);
  if (input.content !== undefined || input.edit) {
    let user;
    if (input.edit) {
      const at = list.findIndex((m) => m.id === input.edit.message_id);
      if (at === -1) { event({ type: 'error', message: 'no such message' }); return res.end(); }
      list.splice(at + 1);
      user = list[at];
      user.content = input.edit.content;
    } else {
      user = { id: nextId++, conversation_id: id, role: 'user', content: input.content, seed: null, sampling: null, status: 'complete', created_at: now(), reasoning: null, reasoning_ms: null };
      list.push(user);
    }
    event({ type: 'user', message: user });
  } else if (input.regenerate) {
    while (list.length && list.at(-1).role === 'assistant') list.pop();
  }
  const seed = conv.settings.seed ?? Math.floor(Math.random() * 2 ** 32);
  const reply = {
    id: nextId++, conversation_id: id, role: 'assistant', content: '', seed, sampling: { ...conv.settings, seed: undefined }, status: 'complete',
    created_at: now(), reasoning: null, reasoning_ms: null,
  };
  list.push(reply);
  conv.updated_at = now();
  event({ type: 'start', message_id: reply.id, seed });
  const pieces = replyPieces(conv.settings.model, seed, list);
  let closed = false;
  let thinkingSince = null;
  req.on('close', () => { closed = true; });
  res.on('close', () => { closed = true; });
  // max_tokens counts the thinking too; a reply cut off while thinking thought until its end.
  for (const { kind, text } of pieces.slice(0, conv.settings.max_tokens)) {
    await new Promise((r) => setTimeout(r, 60));
    if (closed) { reply.status = 'stopped'; return; }
    if (kind === 'reasoning') {
      thinkingSince ??= Date.now();
      reply.reasoning = (reply.reasoning ?? '') + text;
      event({ type: 'reasoning', text });
    } else {
      if (thinkingSince !== null) reply.reasoning_ms ??= Date.now() - thinkingSince;
      reply.content += text;
      event({ type: 'delta', text });
    }
  }
  if (thinkingSince !== null) reply.reasoning_ms ??= Date.now() - thinkingSince;
  event({ type: 'done', message: reply });
  res.end();
}

// Quick chat's one-off answer: OpenAI chat chunks, the seed in the header as the server does.
async function streamCompletion(req, res, input) {
  const seed = input.seed ?? Math.floor(Math.random() * 2 ** 32);
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'x-seedbar-seed': String(seed) });
  let closed = false;
  res.on('close', () => { closed = true; });
  for (const { kind, text } of replyPieces(input.model ?? '', seed, input.messages ?? [])) {
    await new Promise((r) => setTimeout(r, 60));
    if (closed) return;
    const delta = kind === 'reasoning' ? { reasoning_content: text } : { content: text };
    res.write(`data: ${JSON.stringify({ seed, choices: [{ index: 0, delta }] })}\n\n`);
  }
  res.end('data: [DONE]\n\n');
}

const server = createServer(async (req, res) => {
  const url = new URL(req.url, 'http://x');
  const path = url.pathname;
  try {
    if (path === '/v1/chat/completions' && req.method === 'POST') return streamCompletion(req, res, await body(req));
    if (!path.startsWith('/app/')) {
      const file = normalize(join(dir, path === '/' ? 'index.html' : path));
      if (!file.startsWith(normalize(dir))) return fail(res, 403, 'no');
      try {
        const data = await readFile(file);
        const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml' };
        res.writeHead(200, { 'Content-Type': types[extname(file)] ?? 'application/octet-stream' });
        return res.end(data);
      } catch {
        return fail(res, 404, `not found: ${path}`);
      }
    }
    if (apiKey && req.headers.authorization !== `Bearer ${apiKey}`) {
      return send(res, 401, { error: { message: req.headers.authorization ? 'the API key is not valid' : 'this server needs an API key: send `Authorization: Bearer <key>`', code: 'invalid_api_key' } });
    }
    const m = req.method;
    let match;
    if (path === '/app/chat/completions' && m === 'POST') return streamCompletion(req, res, await body(req));
    if (path === '/app/conversations' && m === 'GET') {
      const q = (url.searchParams.get('q') ?? '').toLowerCase();
      const list = [...conversations.values()]
        .filter((c) => !q || c.title.toLowerCase().includes(q) || messages.get(c.id).some((x) => x.content.toLowerCase().includes(q)))
        .sort((a, b) => b.updated_at.localeCompare(a.updated_at) || b.id - a.id);
      return send(res, 200, list);
    }
    if (path === '/app/conversations' && m === 'POST') {
      const b = await body(req);
      const c = { id: nextId++, title: b.title ?? 'New chat', created_at: now(), updated_at: now(), settings: { ...defaults, ...b.settings } };
      conversations.set(c.id, c);
      const sampling = { ...c.settings, seed: undefined };
      messages.set(c.id, (b.messages ?? []).map((x) => ({
        id: nextId++, conversation_id: c.id, role: x.role, content: x.content, seed: x.seed ?? null,
        sampling: x.seed === undefined ? null : sampling, status: 'complete', created_at: now(), reasoning: null, reasoning_ms: null,
      })));
      return send(res, 200, c);
    }
    if ((match = /^\/app\/conversations\/(\d+)$/.exec(path))) {
      const id = Number(match[1]);
      const c = conversations.get(id);
      if (!c) return fail(res, 404, `no conversation ${id}`);
      if (m === 'GET') return send(res, 200, detail(id));
      if (m === 'PATCH') {
        const b = await body(req);
        if (b.settings?.seed !== undefined && b.settings.seed !== null && !(Number.isSafeInteger(b.settings.seed) && b.settings.seed >= 0)) return fail(res, 400, 'seed must be an integer in 0..2^53-1');
        if (b.title !== undefined) c.title = b.title;
        if (b.settings) c.settings = { ...c.settings, ...b.settings };
        c.updated_at = now();
        return send(res, 200, c);
      }
      if (m === 'DELETE') {
        conversations.delete(id);
        messages.delete(id);
        return send(res, 204);
      }
    }
    if ((match = /^\/app\/conversations\/(\d+)\/reply$/.exec(path)) && m === 'POST') {
      const id = Number(match[1]);
      if (!conversations.has(id)) return fail(res, 404, `no conversation ${id}`);
      return streamReply(req, res, id, await body(req));
    }
    if (path === '/app/models' && m === 'GET') return send(res, 200, models);
    if ((match = /^\/app\/models\/([^/]+)$/.exec(path)) && m === 'DELETE') {
      const name = decodeURIComponent(match[1]);
      const at = models.findIndex((x) => x.name === name);
      if (at === -1) return fail(res, 404, `no model ${name}`);
      models.splice(at, 1);
      return send(res, 204);
    }
    if (path === '/app/models/pull' && m === 'POST') {
      const { repo } = await body(req);
      const pull = { repo, status: 'downloading', downloaded_bytes: 0, total_bytes: 250_000_000, error: null };
      pulls.set(repo, pull);
      if (repo.includes('offline')) {
        setTimeout(() => Object.assign(pull, { status: 'error', error: 'error sending request for url (https://huggingface.co/api/models/x): dns error: failed to lookup address information' }), 700);
      } else {
        const timer = setInterval(() => {
          if (pull.status !== 'downloading') return clearInterval(timer);
          pull.downloaded_bytes = Math.min(pull.total_bytes, pull.downloaded_bytes + 25_000_000);
          if (pull.downloaded_bytes >= pull.total_bytes) {
            pull.status = 'done';
            const name = repo.includes(':') ? repo.split(':')[1].replace(/\.gguf$/, '') : repo.replace('/', '--');
            models.push({ name, format: 'safetensors', bytes: pull.total_bytes, quantization: null, architecture: 'qwen3', supported: true, loaded: false, memory_needed: pull.total_bytes, fits: true, capabilities: ['completion'] });
          }
        }, 400);
      }
      return send(res, 202, pull);
    }
    if (path === '/app/models/pulls' && m === 'GET') return send(res, 200, [...pulls.values()]);
    if ((match = /^\/app\/models\/pulls\/([^/]+)\/([^/]+)$/.exec(path)) && m === 'DELETE') {
      const pull = pulls.get(`${decodeURIComponent(match[1])}/${decodeURIComponent(match[2])}`);
      if (!pull) return fail(res, 404, 'no such pull');
      if (pull.status === 'downloading') pull.status = 'cancelled';
      return send(res, 200, pull);
    }
    if (path === '/app/remotes' && m === 'GET') return send(res, 200, remotes);
    if (path === '/app/remotes' && m === 'POST') {
      const b = await body(req);
      if (!b.name || !/^https?:\/\//.test(b.url ?? '')) return fail(res, 400, 'a remote needs a name and an http(s) URL');
      if (models.some((x) => x.name === b.name)) return fail(res, 409, `'${b.name}' is the name of a model on this computer`);
      if (b.url.includes('unreachable')) return fail(res, 502, `the remote engine '${b.name}' (${b.url}) cannot be reached: connection refused`);
      if (b.key === 'wrong') {
        return send(res, 401, { error: { message: `the remote engine '${b.name}' answered 401: the API key is not valid`, code: 'upstream_unauthorized' } });
      }
      const url = b.url.replace(/\/+$/, '').replace(/\/v1$/, '');
      const remote = {
        name: b.name, url, api: b.api ?? 'openai', model: b.model || 'Qwen/Qwen3-8B', engine: 'vllm', engine_version: '0.11.0',
        identical_seeds: b.identical_seeds ?? false, supports: { seeds: true, tools: true, images: false, structured: true, reasoning: true },
        timeout_s: b.timeout_s ?? 300, has_key: !!b.key, owner: `vllm at ${url.split('://')[1].split('/')[0]}`,
      };
      remotes.splice(0, remotes.length, ...remotes.filter((x) => x.name !== b.name), remote);
      return send(res, 201, remote);
    }
    if ((match = /^\/app\/remotes\/([^/]+)$/.exec(path)) && m === 'DELETE') {
      const at = remotes.findIndex((x) => x.name === decodeURIComponent(match[1]));
      if (at === -1) return fail(res, 404, `no remote ${decodeURIComponent(match[1])}`);
      remotes.splice(at, 1);
      return send(res, 204);
    }
    if (path === '/app/settings' && m === 'GET') return send(res, 200, appSettings);
    if (path === '/app/settings' && m === 'PUT') {
      const b = await body(req);
      if (b.default_model && !models.some((x) => x.name === b.default_model)) {
        return send(res, 400, { error: { message: `model '${b.default_model}' is not installed; installed: ${models.map((x) => x.name).join(', ')}`, type: 'invalid_request_error', param: 'default_model', code: 'model_not_found' } });
      }
      appSettings = b;
      return send(res, 200, appSettings);
    }
    if (path === '/app/catalogue' && m === 'GET') return send(res, 200, catalogue);
    if (path === '/app/status' && m === 'GET') {
      return send(res, 200, {
        state: 'ready', model: appSettings.default_model || defaultModel, percent: null, problem: null, fix: null, actions: [],
        endpoint: `http://127.0.0.1:${server.address().port}/v1`, paused: false, message: null,
      });
    }
    return fail(res, 404, `no route ${m} ${path}`);
  } catch (error) {
    return fail(res, 500, String(error));
  }
});

server.listen(port, '127.0.0.1', () => {
  console.log(`Seedbar serving ${defaultModel} at http://127.0.0.1:${server.address().port}/v1 (mock)`);
});
