// Shared pieces of the browser tests: a `seedbar serve` of our own (temp SEEDBAR_HOME, the
// default model added, port 0, the built UI) and Debian's Chromium through playwright-core.
//
// Env: SEEDBAR_BIN (default target/debug/seedbar), SEEDBAR_DEV_CACHE (default
// ~/.cache/seedbar-dev, holds default-model.path), CHROMIUM (default /usr/bin/chromium),
// SEEDBAR_E2E_MOCK=1 runs against ui/scripts/mock-server.mjs instead (UI work only).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const UI_DIST = join(ROOT, 'ui/dist');
export const MODEL = 'SmolLM2-135M-Instruct';
const require = createRequire(join(ROOT, 'ui/package.json'));
const { chromium } = require('playwright-core');

export const MOCK = process.env.SEEDBAR_E2E_MOCK === '1';
const BIN = resolve(ROOT, process.env.SEEDBAR_BIN ?? 'target/debug/seedbar');
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const DEV_CACHE = process.env.SEEDBAR_DEV_CACHE ?? join(homedir(), '.cache/seedbar-dev');
/** The Python of the tests' virtualenv (mlx-lm, to write test checkpoints). */
export const VENV_PYTHON = join(DEV_CACHE, 'venv/bin/python');

/** The GGUF file of the default model, as the set-up script recorded it. */
export function defaultModelPath() {
  const file = join(DEV_CACHE, 'default-model.path');
  if (!existsSync(file)) throw new Error(`${file} is missing: run scripts/setup.sh first`);
  return readFileSync(file, 'utf8').trim();
}

/** What stops a test run early, with the reason (undefined when all is there). */
export function missing() {
  if (!existsSync(join(UI_DIST, 'index.html'))) return 'ui/dist is not built (cd ui && npm run build)';
  if (!existsSync(CHROMIUM)) return `${CHROMIUM} is missing (apt-get install chromium)`;
  if (!MOCK && !existsSync(BIN)) return `${BIN} is missing (cargo build)`;
  return undefined;
}

/**
 * Writes into `dir` a random-weight Qwen3-shaped checkpoint that thinks (tests/checkpoints.py):
 * its chat template opens a `<think>` block, so every reply starts inside the thinking.
 */
export function writeThinkingCheckpoint(dir) {
  const code = 'import sys; sys.path.insert(0, "tests"); from pathlib import Path; from checkpoints import write_checkpoint; '
    + 'write_checkpoint(Path(sys.argv[1]), "qwen3", thinking=True)';
  const run = spawnSync(VENV_PYTHON, ['-c', code, dir], { cwd: ROOT, encoding: 'utf8', timeout: 300_000 });
  if (run.status !== 0) throw new Error(`writing the thinking checkpoint failed (${run.status}):\n${run.stdout}\n${run.stderr}`);
}

/**
 * Writes into `dir` a random-weight Gemma 3 vision checkpoint (tests/vision_checkpoints.py)
 * and beside it `picture.png`, a picture to send it.
 */
export function writeVisionCheckpoint(dir) {
  const code = 'import sys; sys.path.insert(0, "tests"); from pathlib import Path; '
    + 'from vision_checkpoints import write_vision_checkpoint; from test_server_images import picture; '
    + 'write_vision_checkpoint(Path(sys.argv[1])); (Path(sys.argv[1]) / "picture.png").write_bytes(picture(3))';
  const run = spawnSync(VENV_PYTHON, ['-c', code, dir], { cwd: ROOT, encoding: 'utf8', timeout: 300_000 });
  if (run.status !== 0) throw new Error(`writing the vision checkpoint failed (${run.status}):\n${run.stdout}\n${run.stderr}`);
}

/**
 * Starts a server of our own. Resolves with { url, stop, log, home } once it prints
 * "Seedbar serving <model> at http://127.0.0.1:<port>/v1". `models`: more to add to its store
 * besides the default one, as [{ path, name }] (the mock has its own, `thinker` among them).
 * `home`: the store of an earlier server to serve again (its models already added); `stop({
 * keep: true })` leaves a store for that.
 */
export async function startServer({ apiKey, allowOrigin, models = [], home: earlier } = {}) {
  const home = earlier ?? mkdtempSync(join(tmpdir(), 'seedbar-e2e-'));
  let command;
  let args;
  if (MOCK) {
    command = process.execPath;
    args = [join(ROOT, 'ui/scripts/mock-server.mjs'), '--port', '0', '--dir', UI_DIST];
  } else {
    const adding = earlier ? [] : [{ path: defaultModelPath(), name: MODEL }, ...models];
    for (const { path, name } of adding) {
      const add = spawnSync(BIN, ['models', 'add', path, '--name', name], {
        env: { ...process.env, SEEDBAR_HOME: home }, encoding: 'utf8', timeout: 120_000,
      });
      if (add.status !== 0) throw new Error(`seedbar models add ${name} failed (${add.status}):\n${add.stdout}\n${add.stderr}`);
    }
    command = BIN;
    args = ['serve', '--port', '0', '--ui-dir', UI_DIST, '--model', MODEL];
  }
  if (apiKey) args.push('--api-key', apiKey);
  if (allowOrigin && !MOCK) args.push('--allow-origin', allowOrigin);
  const child = spawn(command, args, { env: { ...process.env, SEEDBAR_HOME: home, RUST_LOG: process.env.RUST_LOG ?? 'warn' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not start in 180 s:\n${log}`)), 180_000);
    const onData = (chunk) => {
      log += chunk;
      const match = /Seedbar serving (\S+) at (http:\/\/127\.0\.0\.1:\d+)\/v1/.exec(log);
      if (match) {
        clearTimeout(timer);
        resolveUrl(match[2]);
      }
    };
    child.stdout.setEncoding('utf8').on('data', onData);
    child.stderr.setEncoding('utf8').on('data', (chunk) => { log += chunk; });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code}) before serving:\n${log}`));
    });
  });
  const stop = async ({ keep = false } = {}) => {
    if (child.exitCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    if (!keep) rmSync(home, { recursive: true, force: true });
  };
  return { url, stop, home, log: () => log };
}

/** Chromium with a fresh profile; one page per call of newPage(). */
export async function launchBrowser() {
  const profile = mkdtempSync(join(tmpdir(), 'seedbar-e2e-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
    viewport: { width: 1180, height: 760 },
    deviceScaleFactor: 1,
    colorScheme: 'light',
  });
  context.setDefaultTimeout(30_000);
  const errors = [];
  const newPage = async () => {
    const page = await context.newPage();
    page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
    return page;
  };
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, newPage, close, errors };
}

/** Serves ui/dist from another origin (as the Tauri window has its own). */
export async function serveStatic() {
  const { createServer } = await import('node:http');
  const { readFile } = await import('node:fs/promises');
  const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css' };
  const server = createServer(async (req, res) => {
    const path = new URL(req.url, 'http://x').pathname;
    const file = join(UI_DIST, path === '/' ? 'index.html' : path.replace(/\.\.+/g, ''));
    try {
      const data = await readFile(file);
      res.writeHead(200, { 'Content-Type': types[file.slice(file.lastIndexOf('.'))] ?? 'application/octet-stream' });
      res.end(data);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, stop: () => new Promise((r) => server.close(r)) };
}

/** Where a screenshot goes: `$SEEDBAR_SCREENSHOTS` (`make screenshots`: docs/screenshots), else
 *  target/screenshots, so the tests leave the tracked pictures alone. */
export function screenshotPath(name) {
  const dir = process.env.SEEDBAR_SCREENSHOTS || join(ROOT, 'target/screenshots');
  mkdirSync(dir, { recursive: true });
  return join(dir, name);
}

// UI steps shared by the tests.

const tid = (id) => `[data-testid="${id}"]`;
export { tid };

/** Creates a conversation through the UI and sets its max tokens; returns its id. */
export async function newChat(page, { maxTokens = 24 } = {}) {
  const before = page.url();
  await page.click(tid('new-chat'));
  await page.waitForFunction((prev) => /#\/c\/\d+$/.test(location.href) && location.href !== prev, before);
  await page.waitForSelector(`${tid('chat-view')}[data-conversation]`);
  const id = Number(new URL(page.url()).hash.split('/').pop());
  await setMaxTokens(page, maxTokens);
  return id;
}

export async function openSettings(page) {
  if (!(await page.$(tid('settings-panel')))) await page.click(tid('toggle-settings'));
  await page.waitForSelector(tid('settings-panel'));
}

export async function setMaxTokens(page, n) {
  await openSettings(page);
  const input = page.locator(tid('setting-max-tokens'));
  if ((await input.inputValue()) === String(n)) return;
  const saved = page.waitForResponse((r) => r.request().method() === 'PATCH' && /\/app\/conversations\/\d+$/.test(r.url()));
  await input.fill(String(n));
  await input.press('Tab');
  const response = await saved;
  if (!response.ok()) throw new Error(`PATCH max_tokens answered ${response.status()}: ${await response.text()}`);
}

export async function pinSeed(page, seed) {
  const id = await page.getAttribute(tid('chat-view'), 'data-conversation');
  if (await page.$(tid('seed-random'))) await page.click(tid('seed-random'));
  const input = page.locator(tid('seed-input'));
  const saved = page.waitForResponse((r) => r.request().method() === 'PATCH' && r.url().endsWith(`/app/conversations/${id}`));
  await input.fill(String(seed));
  await input.press('Enter');
  const response = await saved;
  if (!response.ok()) throw new Error(`PATCH seed answered ${response.status()}: ${await response.text()}`);
  await page.waitForSelector(`${tid('seed-pin')}[data-pinned="true"]`);
}

/** The messages shown: [{role, status, text, seed}]. */
export function messages(page) {
  return page.$$eval('[data-testid="message"]', (els) => els.map((el) => ({
    id: Number(el.getAttribute('data-id')),
    role: el.getAttribute('data-role'),
    status: el.getAttribute('data-status'),
    text: el.querySelector('[data-testid="message-content"]')?.textContent ?? '',
    seed: el.querySelector('[data-testid="message-seed"]')?.textContent?.replace('seed ', '') ?? null,
  })));
}

/** How many replies the open conversation finished in this page. */
export async function repliesDone(page) {
  return Number(await page.getAttribute(tid('chat-view'), 'data-replies'));
}

/**
 * Runs `action` (which starts a reply in the open conversation) and waits for that reply
 * to finish; returns the last assistant message.
 */
export async function replyTo(page, action, timeout = 120_000) {
  const id = await page.getAttribute(tid('chat-view'), 'data-conversation');
  const before = await repliesDone(page);
  await action();
  await page.waitForSelector(`${tid('chat-view')}[data-conversation="${id}"][data-replies="${before + 1}"]`, { timeout });
  const list = await messages(page);
  return list.filter((m) => m.role === 'assistant').at(-1);
}

/** Sends a message in the open conversation and waits for the reply. */
export async function send(page, text) {
  return replyTo(page, async () => {
    await page.fill(tid('composer-input'), text);
    await page.press(tid('composer-input'), 'Enter');
  });
}

export async function regenerate(page) {
  return replyTo(page, () => page.click(tid('regenerate')));
}
