// Images in the chat window, against a real `seedbar serve` with a random-weight Gemma 3 vision
// checkpoint (tests/vision_checkpoints.py): a picture pasted into the composer shows as a
// thumbnail, goes out with the message, the reply streams, and the conversation still shows the
// picture after the server restarts (stored in its SQLite file) and the page reloads. A picture
// dropped on a text-only model's conversation is refused with the server's reason, and the
// composer keeps it.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { MOCK, MODEL, VENV_PYTHON, launchBrowser, messages, missing, replyTo, startServer, tid, writeVisionCheckpoint } from './harness.mjs';

const SEER = 'seer';
const skip = missing() ?? (MOCK ? 'needs a real server and a vision model'
  : existsSync(VENV_PYTHON) ? undefined : `${VENV_PYTHON} is missing (scripts/setup.sh)`);

/** Pastes a PNG (base64) into the composer as the clipboard would. */
async function pastePicture(page, base64) {
  await page.evaluate((data) => {
    const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
    const transfer = new DataTransfer();
    transfer.items.add(new File([bytes], 'pasted.png', { type: 'image/png' }));
    const input = document.querySelector('[data-testid="composer-input"]');
    input.dispatchEvent(new ClipboardEvent('paste', { clipboardData: transfer, bubbles: true, cancelable: true }));
  }, base64);
}

/** Whether every image of the page's messages has loaded. */
function imagesShown(page) {
  return page.$$eval('[data-testid="message-image"]', (imgs) => imgs.length > 0 && imgs.every((img) => img.complete && img.naturalWidth > 0));
}

describe('images in the chat window', { skip, timeout: 600_000 }, () => {
  let checkpoint;
  let server;
  let browser;
  let page;
  let picture;

  const api = async (method, path, body) => {
    const response = await fetch(server.url + path, {
      method, headers: body ? { 'Content-Type': 'application/json' } : {}, body: body && JSON.stringify(body),
    });
    assert.ok(response.ok, `${method} ${path} answered ${response.status}: ${await response.clone().text()}`);
    return response.json();
  };

  before(async () => {
    checkpoint = mkdtempSync(join(tmpdir(), 'seedbar-e2e-seer-'));
    writeVisionCheckpoint(checkpoint);
    picture = readFileSync(join(checkpoint, 'picture.png')).toString('base64');
    server = await startServer({ models: [{ path: checkpoint, name: SEER }] });
    browser = await launchBrowser();
    page = await browser.newPage();
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
    if (checkpoint) rmSync(checkpoint, { recursive: true, force: true });
    if (browser?.errors.length) console.log('browser errors:\n' + browser.errors.join('\n'));
  });

  it('sends a pasted picture, streams the reply, and shows the picture after a restart', async () => {
    const { id } = await api('POST', '/app/conversations', { settings: { model: SEER, seed: 4242, max_tokens: 16 } });
    await page.goto(`${server.url}/#/c/${id}`);
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${id}"]`);
    await pastePicture(page, picture);
    await page.waitForSelector(tid('attached-image'));
    await page.fill(tid('composer-input'), 'What is in this picture?');
    const reply = await replyTo(page, () => page.press(tid('composer-input'), 'Enter'));
    assert.equal(reply.status, 'complete');
    assert.ok(reply.text.length > 0, 'the reply streamed');
    assert.equal(await page.$(tid('attached-image')), null, 'the composer let the picture go');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="message-image"]').length === 1);
    assert.ok(await imagesShown(page));

    const stored = await api('GET', `/app/conversations/${id}`);
    const asked = stored.messages.find((m) => m.role === 'user');
    assert.equal(asked.images.length, 1);
    const bytes = Buffer.from(await (await fetch(`${server.url}/app/images/${asked.images[0]}`)).arrayBuffer());
    assert.equal(bytes.toString('base64'), picture, 'stored as it was sent');

    // A new server on the same store; the page comes back to it.
    const home = server.home;
    await server.stop({ keep: true });
    server = await startServer({ home });
    await page.goto(`${server.url}/#/c/${id}`);
    await page.waitForSelector(tid('message-image'));
    await page.waitForFunction(() => [...document.querySelectorAll('[data-testid="message-image"]')].every((img) => img.complete && img.naturalWidth > 0));
    const shown = await messages(page);
    assert.deepEqual(shown.map((m) => m.role), ['user', 'assistant']);
    assert.equal(shown[1].text, reply.text, 'the reply is kept as it streamed');
  });

  it('refuses a picture for a model that reads text, and keeps it in the composer', async () => {
    const { id } = await api('POST', '/app/conversations', { settings: { model: MODEL, max_tokens: 8 } });
    await page.goto(`${server.url}/#/c/${id}`);
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${id}"]`);
    await pastePicture(page, picture);
    await page.fill(tid('composer-input'), 'What is this?');
    await page.press(tid('composer-input'), 'Enter');
    await page.waitForSelector(`${tid('error-toast')}:has-text("does not take images")`);
    await page.waitForSelector(tid('attached-image'));
    assert.equal(await page.inputValue(tid('composer-input')), 'What is this?');
  });
});
