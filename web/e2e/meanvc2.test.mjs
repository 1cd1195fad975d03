// Real-browser end-to-end test of the voice-changer page with MeanVC2.
//
// Starts `bin/voxpipe serve --vc-model <golden tiny MeanVC2 120 ms> --vc-model <… 40 ms>`
// with an empty voice library, opens the page in Chromium with a fake microphone playing
// testdata/speech_en_48k.wav, checks that the voice picker offers both variants with their
// labels and latencies (the 40 ms one lower), picks the meanvc2 voice, uploads the same WAV as
// the target voice through the page's upload control (after checking that a bad upload shows
// the API's error), starts, and checks that converted audio comes back with the server
// reporting the meanvc2 voice; then switches to meanvc2-40ms live and checks the stats card
// follows.
//
// Skips when the golden folder (VOXPIPE_GOLDEN_DIR, default ../shared/golden) lacks
// meanvc2/model.gguf; without meanvc2_40ms/model.gguf it runs with the 120 ms model alone.
// Run from the repository root:
//   go build -o bin/voxpipe ./cmd/voxpipe && node --test web/e2e/

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, launch, sleep, GOLDEN, SPEECH_WAV } from './helpers.mjs';

const MODEL = path.join(GOLDEN, 'meanvc2', 'model.gguf');
const MODEL_40MS = path.join(GOLDEN, 'meanvc2_40ms', 'model.gguf');
const BOTH = existsSync(MODEL_40MS);
const LEVEL_THRESHOLD = 0.01;
const AUDIO_TIMEOUT_MS = 15_000;

const skip = existsSync(MODEL) ? false : `golden MeanVC2 model not found at ${MODEL} (set VOXPIPE_GOLDEN_DIR)`;

let server = null;
let browser = null;
let voicesDir = null;

before(async () => {
  if (skip) return;
  voicesDir = mkdtempSync(path.join(os.tmpdir(), 'voxpipe-e2e-voices-'));
  const models = BOTH ? ['--vc-model', MODEL, '--vc-model', MODEL_40MS] : ['--vc-model', MODEL];
  server = await startServer([...models, '--voices', voicesDir, '--threads', '2']);
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
    // The voice picker lists the variants with their labels and algorithmic latencies.
    const options = await page.$$eval('#voice option', (os) => os.map((o) => ({ value: o.value, text: o.textContent })));
    t.diagnostic(`voice picker: ${JSON.stringify(options)}`);
    const option = (v) => options.find((o) => o.value === v);
    const latencyOf = (v) => Number(/— (\d+) ms$/.exec(option(v)?.text ?? '')?.[1]);
    for (const v of BOTH ? ['meanvc2', 'meanvc2-120ms', 'meanvc2-40ms', 'dsp'] : ['meanvc2', 'meanvc2-120ms', 'dsp']) {
      assert.ok(option(v), `no ${v} in the voice picker`);
      assert.ok(latencyOf(v) > 0, `the picker shows no latency for ${v}: ${option(v).text}`);
    }
    assert.match(option('meanvc2-120ms').text, /^MeanVC2 120 ms \(quality\) — \d+ ms$/);
    if (BOTH) {
      assert.match(option('meanvc2-40ms').text, /^MeanVC2 40 ms \(low latency\) — \d+ ms$/);
      assert.ok(latencyOf('meanvc2-40ms') < latencyOf('meanvc2-120ms'), 'the 40 ms model is not listed as lower latency');
      // Every MeanVC2 variant takes a target voice.
      await page.selectOption('#voice', 'meanvc2-40ms');
      assert.equal(await page.locator('#target').isVisible(), true, 'no target picker for meanvc2-40ms');
      await page.selectOption('#voice', 'dsp');
    }
    // The picker shows only for a voice that takes a reference clip.
    assert.equal(await page.locator('#target').isVisible(), false, 'target picker visible for the dsp voice');
    await page.selectOption('#voice', 'meanvc2');
    assert.equal(await page.locator('#target').isVisible(), true, 'no target picker for meanvc2');

    // A file that is no audio format the server reads: the API's message is shown.
    await page.fill('#ref-name', 'Broken');
    await page.setInputFiles('#ref-file', { name: 'broken.wav', mimeType: 'audio/wav', buffer: Buffer.from('not a wav file') });
    await page.click('#ref-upload');
    await page.waitForFunction(() => document.querySelector('#ref-msg').dataset.kind === 'error', null, { timeout: 5000 });
    const bad = await page.locator('#ref-msg').textContent();
    t.diagnostic(`bad upload: ${bad}`);
    assert.match(bad, /not a WAV, FLAC, Ogg Vorbis, Ogg Opus or MP3 clip/, 'the API error message is not shown');

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
    // The stats card shows the algorithmic latency and the server's output cushion.
    assert.match(await page.locator('#lat-algo').textContent(), /^\d+\.\d ms$/);
    assert.match(await page.locator('#cushion').textContent(), /^\d+\.\d ms/);

    if (BOTH) {
      // Switch to the low-latency model mid-session, with the same target voice.
      const before = stats.latency_ms.algorithmic;
      await page.selectOption('#voice', 'meanvc2-40ms');
      try {
        await page.waitForFunction(() => window.voxpipe.lastReady && window.voxpipe.lastReady.voice === 'meanvc2-40ms', null, { timeout: 10_000 });
        await page.waitForFunction(() => window.voxpipe.lastStats && window.voxpipe.lastStats.voice === 'meanvc2-40ms', null, { timeout: 10_000 });
      } catch {
        assert.fail(await diagnose('no switch to meanvc2-40ms'));
      }
      const ready = await page.evaluate(() => window.voxpipe.lastReady);
      const after = await page.evaluate(() => window.voxpipe.lastStats.latency_ms.algorithmic);
      t.diagnostic(`algorithmic latency: meanvc2 ${before} ms in stats; meanvc2-40ms ${after} ms in stats, ${ready.algorithmic_latency_ms} ms in ready (listed ${latencyOf('meanvc2-40ms')} ms)`);
      assert.ok(after < before, `the 40 ms model's algorithmic latency ${after} ms is not below the 120 ms model's ${before} ms`);
      assert.equal(Math.round(ready.algorithmic_latency_ms), latencyOf('meanvc2-40ms'), 'the picker lists another latency than the session reports');
      if ((await page.locator('#status').getAttribute('data-kind')) === 'error') assert.fail(await diagnose('the page shows an error'));
    }

    await page.click('#start');
    await page.waitForFunction(() => window.voxpipe.state === 'idle', null, { timeout: 5000 });
  } finally {
    await context.close();
  }
});
