// Real-browser end-to-end test of the voice-changer page with MeanVC2.
//
// Starts `bin/voxpipe serve --vc-model <golden tiny MeanVC2>` with an empty voice library,
// opens the page in Chromium with a fake microphone playing testdata/speech_en_48k.wav,
// picks the meanvc2 voice, uploads the same WAV as the target voice through the page's
// upload control (after checking that a bad upload shows the API's error), starts, and checks
// that converted audio comes back with the server reporting the meanvc2 voice.
//
// Skips when the golden folder (VOXPIPE_GOLDEN_DIR, default ../shared/golden) lacks
// meanvc2/model.gguf. Run from the repository root:
//   go build -o bin/voxpipe ./cmd/voxpipe && node --test web/e2e/

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, launch, sleep, GOLDEN, SPEECH_WAV } from './helpers.mjs';

const MODEL = path.join(GOLDEN, 'meanvc2', 'model.gguf');
const LEVEL_THRESHOLD = 0.01;
const AUDIO_TIMEOUT_MS = 15_000;

const skip = existsSync(MODEL) ? false : `golden MeanVC2 model not found at ${MODEL} (set VOXPIPE_GOLDEN_DIR)`;

let server = null;
let browser = null;
let voicesDir = null;

before(async () => {
  if (skip) return;
  voicesDir = mkdtempSync(path.join(os.tmpdir(), 'voxpipe-e2e-voices-'));
  server = await startServer(['--vc-model', MODEL, '--voices', voicesDir, '--threads', '2']);
  browser = await launch(SPEECH_WAV);
});

after(async () => {
  try {
    if (browser) await browser.close();
  } finally {
    browser = null;
    if (server) await server.stop();
    if (voicesDir) rmSync(voicesDir, { recursive: true, force: true });
  }
});

test('voice changer page: uploads a target voice and converts with MeanVC2', { skip }, async (t) => {
  const context = await browser.newContext({ viewport: { width: 420, height: 1100 } });
  const page = await context.newPage();
  const consoleLines = [];
  page.on('console', (m) => consoleLines.push(`[${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => consoleLines.push(`[pageerror] ${e.message}`));
  const diagnose = async (what) => {
    let status = '?';
    let refMsg = '?';
    try {
      status = await page.locator('#status').textContent();
      refMsg = await page.locator('#ref-msg').textContent();
    } catch {}
    return (
      `${what}\n  status line: ${status}\n  upload message: ${refMsg}\n` +
      `  browser console:\n    ${consoleLines.slice(-30).join('\n    ') || '(empty)'}\n` +
      `  server output (tail):\n${(server ? server.output() : '').slice(-4000)}`
    );
  };

  try {
    await page.goto(server.url + '/');
    await page.waitForFunction(() => window.voxpipe && window.voxpipe.voicesLoaded, null, { timeout: 5000 });
    // The picker shows only for a voice that takes a reference clip.
    assert.equal(await page.locator('#target').isVisible(), false, 'target picker visible for the dsp voice');
    await page.selectOption('#voice', 'meanvc2');
    assert.equal(await page.locator('#target').isVisible(), true, 'no target picker for meanvc2');

    // A file that is not a WAV: the API's message is shown.
    await page.fill('#ref-name', 'Broken');
    await page.setInputFiles('#ref-file', { name: 'broken.wav', mimeType: 'audio/wav', buffer: Buffer.from('not a wav file') });
    await page.click('#ref-upload');
    await page.waitForFunction(() => document.querySelector('#ref-msg').dataset.kind === 'error', null, { timeout: 5000 });
    const bad = await page.locator('#ref-msg').textContent();
    t.diagnostic(`bad upload: ${bad}`);
    assert.match(bad, /not a WAV clip/, 'the API error message is not shown');

    // The real clip: uploaded, listed and selected.
    await page.fill('#ref-name', 'Speaker');
    await page.setInputFiles('#ref-file', SPEECH_WAV);
    await page.click('#ref-upload');
    try {
      await page.waitForFunction(() => document.querySelector('#ref-msg').dataset.kind === 'ok', null, { timeout: 10_000 });
    } catch {
      assert.fail(await diagnose('the upload did not succeed'));
    }
    const selected = await page.$eval('#ref', (s) => ({ value: s.value, text: s.selectedOptions[0].textContent }));
    t.diagnostic(`selected target voice: ${JSON.stringify(selected)}`);
    assert.match(selected.value, /^v_[0-9a-f]{16}$/);
    assert.match(selected.text, /^Speaker/);

    await page.click('#start');
    try {
      await page.waitForFunction(() => window.voxpipe.state === 'connected', null, { timeout: 15_000 });
      await page.waitForFunction(() => window.voxpipe.lastReady && window.voxpipe.lastReady.voice === 'meanvc2', null, { timeout: 10_000 });
    } catch {
      assert.fail(await diagnose('no live meanvc2 session'));
    }
    let maxLevel = 0;
    let stats = null;
    const deadline = Date.now() + AUDIO_TIMEOUT_MS;
    while (Date.now() < deadline) {
      maxLevel = Math.max(maxLevel, await page.evaluate(() => window.voxpipe.outputLevel()));
      stats = await page.evaluate(() => window.voxpipe.lastStats);
      if (maxLevel > LEVEL_THRESHOLD && stats && stats.voice === 'meanvc2' && stats.chunks > 0) break;
      await sleep(100);
    }
    t.diagnostic(`max output RMS ${maxLevel.toFixed(4)}; server stats ${JSON.stringify(stats)}`);
    if (!(maxLevel > LEVEL_THRESHOLD)) assert.fail(await diagnose(`no converted audio: max RMS ${maxLevel.toFixed(5)}`));
    assert.equal(stats && stats.voice, 'meanvc2', 'stats should report the meanvc2 voice');
    if ((await page.locator('#status').getAttribute('data-kind')) === 'error') assert.fail(await diagnose('the page shows an error'));

    await page.click('#start');
    await page.waitForFunction(() => window.voxpipe.state === 'idle', null, { timeout: 5000 });
  } finally {
    await context.close();
  }
});
