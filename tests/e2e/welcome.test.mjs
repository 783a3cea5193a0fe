// The first-run welcome against real `seedbar serve`s whose store holds only the default model.
// Online: a stand-in Hugging Face hub (HF_ENDPOINT) serves the GGUF format of the catalogue's
// recommended model (the recommendation itself is MLX, which needs real safetensors) with the
// default model's bytes; the welcome shows this machine and the recommendation, downloads that
// format with progress, makes it the default model (served once loaded, kept in the settings)
// and does not come back after a reload. Offline (a closed port for the hub): the welcome says
// so, offers importing a file, and Skip ends it.
import assert from 'node:assert/strict';
import { createReadStream, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { MOCK, MODEL, defaultModelPath, launchBrowser, missing, screenshotPath, startServer, tid } from './harness.mjs';

const SHA = 'c0ffee';
/** The stand-in hub streams the file in this many pieces, a little apart, so progress shows. */
const PIECES = 40;
const PIECE_GAP_MS = 60;

/** A hub with one GGUF file at `org/name`, as the hub's API and file routes answer. */
async function startHub(repo, file, path) {
  const size = statSync(path).size;
  const server = createServer((req, res) => {
    const url = new URL(req.url, 'http://hub');
    if (url.pathname === `/api/models/${repo}` || url.pathname === `/api/models/${repo}/revision/main`) {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ id: repo, sha: SHA, siblings: [{ rfilename: file, size }] }));
    } else if (url.pathname === `/${repo}/resolve/${SHA}/${file}` || url.pathname === `/${repo}/resolve/main/${file}`) {
      res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': size });
      const stream = createReadStream(path, { highWaterMark: Math.ceil(size / PIECES) });
      stream.on('data', (chunk) => {
        stream.pause();
        res.write(chunk, () => setTimeout(() => stream.resume(), PIECE_GAP_MS));
      });
      stream.on('end', () => res.end());
    } else {
      res.writeHead(404, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ error: 'Repository not found' }));
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, stop: () => new Promise((r) => server.close(r)) };
}

/** The catalogue's recommendation, and a GGUF format to pull instead: the recommended
 *  model's own, else one of its size class, else any. */
function choose(catalogue) {
  const entries = catalogue.models.flatMap((model) => model.formats.map((format) => ({ model, format })));
  const recommended = entries.find((e) => e.format.recommended);
  assert.ok(recommended, 'the catalogue recommends a model');
  const gguf = entries.filter((e) => e.format.format.startsWith('gguf') && e.format.fits);
  const pick = gguf.find((e) => e.model.name === recommended.model.name)
    ?? gguf.find((e) => e.model.size_class === recommended.model.size_class) ?? gguf[0];
  assert.ok(pick, 'the catalogue has a GGUF format that fits');
  return { recommended, pick };
}

const MACHINE = /^\d+(\.\d)? GB · (CPU|NVIDIA GPU \(CUDA\)|Apple GPU \(Metal\))$/;

async function json(url, init) {
  const response = await fetch(url, init);
  assert.ok(response.ok, `${url}: ${response.status}`);
  return response.json();
}

describe('first-run welcome', { skip: missing() || (MOCK && 'needs real servers and a stand-in hub'), timeout: 300_000 }, () => {
  let hub;
  let online;
  let offline;
  let browser;
  let chosen;

  before(async () => {
    // The catalogue is built into the binary: a first server (offline) says what to serve.
    process.env.HF_ENDPOINT = 'http://127.0.0.1:1';
    offline = await startServer();
    chosen = choose(await json(`${offline.url}/app/catalogue`));
    const [repo, file] = chosen.pick.format.pull.split(':');
    hub = await startHub(repo, file, defaultModelPath());
    process.env.HF_ENDPOINT = hub.url;
    online = await startServer();
    browser = await launchBrowser();
  });

  after(async () => {
    await browser?.close();
    await Promise.all([online?.stop(), offline?.stop(), hub?.stop()]);
    if (browser?.errors.length) console.log('browser errors:\n' + browser.errors.join('\n'));
  });

  it('recommends a model for this machine, downloads one with progress and makes it the default', async () => {
    const { recommended, pick } = chosen;
    const page = await browser.newPage();
    await page.goto(online.url);
    await page.waitForSelector(tid('welcome-recommended'));
    assert.match((await page.textContent(tid('welcome-machine'))).trim(), MACHINE);
    const card = await page.textContent(tid('welcome-recommended'));
    assert.ok(card.includes(recommended.model.name) && card.includes(recommended.model.about), card);
    assert.equal(await page.getAttribute(tid('welcome-recommended'), 'data-pull'), recommended.format.pull);
    assert.equal(await page.$(tid('no-conversation')), null, 'the welcome shows instead of the empty chat');
    assert.ok(await page.isEnabled(tid('composer-input')), 'the chat stays usable');
    await page.screenshot({ path: screenshotPath('welcome.png') });

    await page.click(`${tid('welcome-download')}[data-pull="${pick.format.pull}"]`);
    await page.waitForSelector(`${tid('welcome')} ${tid('pull-progress')}`);
    const done = await page.waitForSelector(tid('welcome-done'), { timeout: 60_000 });
    assert.equal((await done.textContent()).trim(), `${pick.model.name} is your default model now.`);

    const settings = await json(`${online.url}/app/settings`);
    assert.equal(settings.welcomed, true);
    assert.equal(settings.default_model, pick.format.model_name);
    const deadline = Date.now() + 60_000;
    let status;
    do {
      status = await json(`${online.url}/app/status`);
      if (status.state === 'ready' && status.model === pick.format.model_name) break;
      await new Promise((r) => setTimeout(r, 250));
    } while (Date.now() < deadline);
    assert.deepEqual([status.state, status.model], ['ready', pick.format.model_name]);
    await page.waitForSelector(tid('welcome-ready'));
    await page.screenshot({ path: screenshotPath('welcome-done.png') });

    await page.reload();
    await page.waitForSelector(tid('no-conversation'));
    assert.equal(await page.$(tid('welcome')), null, 'the welcome does not come back');
    await page.close();
  });

  it('the settings switch the default model back and keep the menu-bar icon, start and image-fetching choices', async () => {
    const page = await browser.newPage();
    await page.goto(`${online.url}/#/settings`);
    const select = tid('settings-default-model');
    // Preact sets an option's value as a property, not an attribute: read the properties.
    const values = () => page.$$eval(`${select} option`, (els) => els.map((o) => o.value));
    await page.waitForFunction(
      ([sel, name]) => [...document.querySelectorAll(`${sel} option`)].some((o) => o.value === name),
      [select, chosen.pick.format.model_name],
    );
    assert.equal(await page.inputValue(select), chosen.pick.format.model_name);
    assert.deepEqual((await values()).toSorted(), ['', MODEL, chosen.pick.format.model_name].toSorted());
    await page.selectOption(select, MODEL);
    await page.uncheck(tid('settings-menu-bar-icon'));
    await page.check(tid('settings-start-minimized'));
    await page.check(tid('settings-fetch-image-urls'));
    await page.click(tid('settings-save'));
    await page.waitForSelector(tid('settings-saved'));
    const settings = await json(`${online.url}/app/settings`);
    assert.deepEqual(
      [settings.default_model, settings.show_menu_bar_icon, settings.start_minimized, settings.welcomed, settings.fetch_image_urls],
      [MODEL, false, true, true, true],
    );
    await page.waitForSelector(`${tid('server-status')}.ready:has-text("${MODEL}")`, { timeout: 60_000 });
    await page.reload();
    await page.waitForSelector(select);
    assert.equal(await page.inputValue(select), MODEL);
    assert.equal(await page.isChecked(tid('settings-menu-bar-icon')), false);
    assert.equal(await page.isChecked(tid('settings-start-minimized')), true);
    assert.equal(await page.isChecked(tid('settings-fetch-image-urls')), true);
    await page.close();
  });

  it('the library chooses a draft model for a chat model, kept in the settings and used from its next reply', async () => {
    const page = await browser.newPage();
    await page.goto(`${online.url}/#/models`);
    const draft = `${tid('model-row')}[data-name="${MODEL}"] ${tid('model-draft')}`;
    const other = chosen.pick.format.model_name;
    await page.waitForFunction(
      ([sel, name]) => [...document.querySelectorAll(`${sel} option`)].some((o) => o.value === name),
      [draft, other],
    );
    assert.equal(await page.inputValue(draft), '');
    await page.selectOption(draft, other);
    let settings;
    for (let i = 0; i < 50 && !settings?.draft_models?.[MODEL]; i++) {
      settings = await json(`${online.url}/app/settings`);
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(settings.draft_models, { [MODEL]: other });
    await page.reload();
    await page.waitForSelector(draft);
    assert.equal(await page.inputValue(draft), other);
    // The same weights under another name: a draft of the same vocabulary, which drafts.
    await json(`${online.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'Tell me about the sea.' }], max_tokens: 24, seed: 3 }),
    });
    const metrics = await (await fetch(`${online.url}/metrics`)).text();
    assert.ok(Number(/seedbar_model_drafted_tokens_total (\d+)/.exec(metrics)?.[1]) > 0, 'the draft model drafted');
    await page.close();
  });

  it('offline: says the hub cannot be reached, offers an import, and Skip ends the welcome', async () => {
    const page = await browser.newPage();
    await page.goto(offline.url);
    await page.waitForSelector(tid('welcome-recommended'));
    await page.click(`${tid('welcome-recommended')} ${tid('welcome-download')}`);
    const error = await page.waitForSelector(tid('welcome-error'), { timeout: 60_000 });
    assert.equal((await error.textContent()).trim(), "Can't reach the model hub — you're offline or it's blocked.");
    assert.ok(await page.$(`${tid('welcome')} ${tid('import-path')}`), 'importing a file is offered');
    assert.match(await page.textContent(`${tid('welcome')} ${tid('pull-error')}`), /cannot reach the Hugging Face hub/);
    await page.screenshot({ path: screenshotPath('welcome-offline.png') });

    const saved = page.waitForResponse((r) => r.request().method() === 'PUT' && r.url().endsWith('/app/settings'));
    await page.click(tid('welcome-skip'));
    assert.ok((await saved).ok());
    await page.waitForSelector(tid('no-conversation'));
    assert.equal(await page.$(tid('welcome')), null);
    const settings = await json(`${offline.url}/app/settings`);
    assert.equal(settings.welcomed, true);
    assert.equal(settings.default_model, '', 'the small model stays');
    await page.close();
  });
});
