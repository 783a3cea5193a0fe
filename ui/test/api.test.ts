import { describe, expect, it, vi } from 'vitest';
import { ApiError, Client, errorFromResponse, readReplyStream, type AnswerPiece } from '../src/api';
import type { ReplyEvent } from '../src/types';

function json(status: number, body: unknown, statusText = '') {
  return new Response(JSON.stringify(body), { status, statusText, headers: { 'Content-Type': 'application/json' } });
}

function streamOf(chunks: string[], { error }: { error?: Error } = {}): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  let i = 0;
  return new ReadableStream({
    pull(controller) {
      if (i < chunks.length) controller.enqueue(encoder.encode(chunks[i++]));
      else if (error) controller.error(error);
      else controller.close();
    },
  });
}

function clientWith(fetchImpl: typeof fetch, key: string | null = null, onUnauthorized = vi.fn()) {
  return { client: new Client({ base: 'http://127.0.0.1:7337/', apiKey: () => key, onUnauthorized, fetch: fetchImpl }), onUnauthorized };
}

describe('errorFromResponse', () => {
  it('reads the OpenAI error shape', async () => {
    const error = await errorFromResponse(json(404, { error: { message: "the model 'x' does not exist", type: 'invalid_request_error', code: 'model_not_found' } }), 'Sending failed');
    expect(error).toBeInstanceOf(ApiError);
    expect(error.message).toBe("Sending failed: the model 'x' does not exist");
    expect(error.status).toBe(404);
    expect(error.code).toBe('model_not_found');
  });

  it('reads Ollama-style and plain-text errors, and empty bodies', async () => {
    expect((await errorFromResponse(json(400, { error: 'bad' }), 'X')).message).toBe('X: bad');
    expect((await errorFromResponse(new Response('gateway exploded', { status: 502 }), 'X')).message).toBe('X: gateway exploded');
    expect((await errorFromResponse(new Response('', { status: 500, statusText: 'Internal Server Error' }), 'X')).message).toBe('X: 500 Internal Server Error');
    expect((await errorFromResponse(new Response(null, { status: 503 }), 'X')).message).toMatch(/^X: 503/);
  });
});

describe('Client', () => {
  it('sends JSON with the bearer key to the base URL', async () => {
    const fetchImpl = vi.fn(async () => json(200, { id: 1, title: 'New chat' }));
    const { client } = clientWith(fetchImpl as unknown as typeof fetch, 'k123');
    await client.createConversation({ title: 'Hello' });
    const [url, init] = fetchImpl.mock.calls[0] as unknown as [string, RequestInit];
    expect(url).toBe('http://127.0.0.1:7337/app/conversations');
    expect(init.method).toBe('POST');
    expect(init.body).toBe('{"title":"Hello"}');
    expect((init.headers as Record<string, string>).Authorization).toBe('Bearer k123');
    expect((init.headers as Record<string, string>)['Content-Type']).toBe('application/json');
  });

  it('sends no Authorization header without a key, and encodes queries', async () => {
    const fetchImpl = vi.fn(async () => json(200, []));
    const { client } = clientWith(fetchImpl as unknown as typeof fetch);
    await client.listConversations(' café & co ');
    const [url, init] = fetchImpl.mock.calls[0] as unknown as [string, RequestInit];
    expect(url).toBe('http://127.0.0.1:7337/app/conversations?q=caf%C3%A9%20%26%20co');
    expect((init.headers as Record<string, string>).Authorization).toBeUndefined();
  });

  it('throws readable errors, and tells about 401s', async () => {
    const { client, onUnauthorized } = clientWith((async () => json(401, { error: { message: 'the API key is not valid', code: 'invalid_api_key' } })) as unknown as typeof fetch);
    await expect(client.listModels()).rejects.toMatchObject({ message: 'Loading models failed: the API key is not valid', status: 401, unauthorized: true });
    expect(onUnauthorized).toHaveBeenCalledOnce();
  });

  it('adds, lists and removes remote engines; an engine refusing its key is not this server asking for one', async () => {
    const calls: [string, RequestInit][] = [];
    const answers = [
      json(401, { error: { message: "the remote engine 'far' answered 401: bad key", code: 'upstream_unauthorized' } }),
      json(201, { name: 'far', owner: 'seedbar at h:1' }),
      json(200, []),
      new Response(null, { status: 204 }),
    ];
    const { client, onUnauthorized } = clientWith((async (url: string, init: RequestInit) => {
      calls.push([url, init]);
      return answers.shift()!;
    }) as unknown as typeof fetch);
    const refused = client.addRemote({ name: 'far', url: 'http://h:1/v1', key: 'sk-wrong' });
    await expect(refused).rejects.toMatchObject({ message: "Adding far failed: the remote engine 'far' answered 401: bad key", status: 401, unauthorized: false });
    expect(onUnauthorized).not.toHaveBeenCalled();
    expect(await client.addRemote({ name: 'far', url: 'http://h:1/v1', key: 'sk-up' })).toEqual({ name: 'far', owner: 'seedbar at h:1' });
    expect(await client.listRemotes()).toEqual([]);
    expect(await client.removeRemote('far/x')).toBeUndefined();
    expect(calls.map(([url, init]) => `${init.method} ${url}`)).toEqual([
      'POST http://127.0.0.1:7337/app/remotes', 'POST http://127.0.0.1:7337/app/remotes',
      'GET http://127.0.0.1:7337/app/remotes', 'DELETE http://127.0.0.1:7337/app/remotes/far%2Fx',
    ]);
    expect(JSON.parse(calls[1][1].body as string)).toEqual({ name: 'far', url: 'http://h:1/v1', key: 'sk-up' });
  });

  it('turns network failures into a message naming the server', async () => {
    const { client } = clientWith((async () => { throw new TypeError('Failed to fetch'); }) as unknown as typeof fetch);
    await expect(client.listModels()).rejects.toMatchObject({
      message: 'Loading models failed: cannot reach the Seedbar server at http://127.0.0.1:7337 (Failed to fetch). Is it running?',
      status: 0,
    });
  });

  it('resolves 204 as undefined and rejects non-JSON answers', async () => {
    const { client } = clientWith((async () => new Response(null, { status: 204 })) as unknown as typeof fetch);
    await expect(client.deleteConversation(3)).resolves.toBeUndefined();
    const { client: bad } = clientWith((async () => new Response('<html>', { status: 200 })) as unknown as typeof fetch);
    await expect(bad.listModels()).rejects.toThrow(/not JSON/);
  });

  it('lets aborts through as AbortError', async () => {
    const { client } = clientWith((async () => { throw new DOMException('aborted', 'AbortError'); }) as unknown as typeof fetch);
    await expect(client.listModels()).rejects.toMatchObject({ name: 'AbortError' });
  });

  it('cancels a pull by org/name path', async () => {
    const fetchImpl = vi.fn(async () => json(200, { repo: 'org/m', status: 'cancelled' }));
    const { client } = clientWith(fetchImpl as unknown as typeof fetch);
    await client.cancelPull('org/m.v1');
    expect((fetchImpl.mock.calls[0] as unknown as [string])[0]).toBe('http://127.0.0.1:7337/app/models/pulls/org/m.v1');
  });

  it('streams a reply through onEvent', async () => {
    const body = streamOf(['data: {"type":"start","message_id":5,"se', 'ed":9}\n\ndata: {"type":"delta","text":"Hi"}\n', '\ndata: {"type":"done","message":{"id":5}}\n\n']);
    const { client } = clientWith((async () => new Response(body, { status: 200, headers: { 'Content-Type': 'text/event-stream' } })) as unknown as typeof fetch);
    const events: ReplyEvent[] = [];
    await client.reply(1, { content: 'Hi' }, (e) => events.push(e));
    expect(events.map((e) => e.type)).toEqual(['start', 'delta', 'done']);
  });

  it('refused replies throw the server message', async () => {
    const { client } = clientWith((async () => json(409, { error: { message: 'a reply is already streaming' } })) as unknown as typeof fetch);
    await expect(client.reply(1, { regenerate: true }, () => {})).rejects.toThrow('The reply failed: a reply is already streaming');
  });
});

describe('readReplyStream', () => {
  it('stops at [DONE]', async () => {
    const events: ReplyEvent[] = [];
    await readReplyStream(streamOf(['data: {"type":"delta","text":"a"}\n\ndata: [DONE]\n\ndata: {"type":"delta","text":"b"}\n\n']), (e) => events.push(e));
    expect(events).toEqual([{ type: 'delta', text: 'a' }]);
  });

  it('passes the thinking on as reasoning events, before the deltas', async () => {
    const events: ReplyEvent[] = [];
    await readReplyStream(streamOf([
      'data: {"type":"reasoning","text":"Hmm"}\n\ndata: {"type":"delta","text":"Hi"}\n\n',
      'data: {"type":"done","message":{"id":1,"reasoning":"Hmm","reasoning_ms":5}}\n\n',
    ]), (e) => events.push(e));
    expect(events.map((e) => e.type)).toEqual(['reasoning', 'delta', 'done']);
  });

  it('reports an error event and finishes', async () => {
    const events: ReplyEvent[] = [];
    await readReplyStream(streamOf(['data: {"type":"error","message":"out of memory"}\n\n']), (e) => events.push(e));
    expect(events).toEqual([{ type: 'error', message: 'out of memory' }]);
  });

  it('throws when the stream ends before done', async () => {
    await expect(readReplyStream(streamOf(['data: {"type":"delta","text":"a"}\n\n']), () => {})).rejects.toThrow(/ended before the reply was finished/);
  });

  it('throws when the connection breaks', async () => {
    await expect(readReplyStream(streamOf(['data: {"type":"delta","text":"a"}\n\n'], { error: new TypeError('network error') }), () => {}))
      .rejects.toThrow(/connection to the server was lost \(network error\)/);
  });

  it('throws on events that are not JSON', async () => {
    await expect(readReplyStream(streamOf(['data: {nope\n\n']), () => {})).rejects.toThrow(/not JSON/);
  });

  it('accepts a final event without its blank line', async () => {
    const events: ReplyEvent[] = [];
    await readReplyStream(streamOf(['data: {"type":"done","message":{"id":1}}']), (e) => events.push(e));
    expect(events.map((e) => e.type)).toEqual(['done']);
  });
});

describe('complete (quick chat)', () => {
  it('streams the text from the app route and gives the seed from the header', async () => {
    const sent: RequestInit[] = [];
    const urls: string[] = [];
    const { client } = clientWith((async (url: string, init: RequestInit) => {
      urls.push(url);
      sent.push(init);
      return new Response(streamOf([
        'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
        'data: {"choices":[{"delta":{"content":"Par"}}]}\n\ndata: {"choices":[{"delta":{"content":"is."}}]}\n\n',
        'data: [DONE]\n\n',
      ]), { status: 200, headers: { 'x-seedbar-seed': '1234' } });
    }) as unknown as typeof fetch);
    const pieces: AnswerPiece[] = [];
    const seed = await client.complete({ model: 'm', messages: [{ role: 'user', content: 'Capital?' }], temperature: 0.7, top_p: 1, max_tokens: 8 }, (p) => pieces.push(p));
    expect(pieces).toEqual([{ kind: 'content', text: 'Par' }, { kind: 'content', text: 'is.' }]);
    expect(seed).toBe(1234);
    expect(JSON.parse(sent[0].body as string)).toMatchObject({ model: 'm', stream: true });
    // Under /app: it answers while the server is paused for outside clients.
    expect(new URL(urls[0], 'http://x').pathname).toBe('/app/chat/completions');
  });

  it('gives the thinking (reasoning_content) apart from the answer', async () => {
    const { client } = clientWith((async () => new Response(streamOf([
      'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
      'data: {"choices":[{"delta":{"reasoning_content":"The capital of France"}}]}\n\n',
      'data: {"choices":[{"delta":{"reasoning_content":" is <b>Paris</b>.","content":null}}]}\n\n',
      'data: {"choices":[{"delta":{"content":"Paris."}}]}\n\ndata: [DONE]\n\n',
    ]), { status: 200 })) as unknown as typeof fetch);
    const pieces: AnswerPiece[] = [];
    await client.complete({ model: 'm', messages: [], temperature: 0.7, top_p: 1, max_tokens: 8 }, (p) => pieces.push(p));
    expect(pieces).toEqual([
      { kind: 'reasoning', text: 'The capital of France' },
      { kind: 'reasoning', text: ' is <b>Paris</b>.' },
      { kind: 'content', text: 'Paris.' },
    ]);
  });

  it('throws an error event as the message, and a stream cut short', async () => {
    const reply = (chunks: string[]) => clientWith((async () => new Response(streamOf(chunks), { status: 200 })) as unknown as typeof fetch).client;
    const body = { model: 'm', messages: [], temperature: 0.7, top_p: 1, max_tokens: 8 };
    await expect(reply(['data: {"error":{"message":"out of memory"}}\n\n']).complete(body, () => {})).rejects.toThrow('The answer failed: out of memory');
    await expect(reply(['data: {"choices":[{"delta":{"content":"a"}}]}\n\n']).complete(body, () => {})).rejects.toThrow(/ended before/);
  });
});
