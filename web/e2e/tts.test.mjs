// Real-browser test of the text-to-speech console (web/static/tts.html).
//
// Starts `bin/voxpipe serve` with the tiny golden MioTTS and MioCodec models
// ($VOXPIPE_GOLDEN_DIR or ../shared/golden; the test skips without them) and the speech
// fixture as the default voice, opens the console in Debian's Chromium, presses Speak and
// checks that audio arrives and plays, that the metrics show, and that Cancel stops it.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { startServer, launch, sleep, GOLDEN, ROOT } from './helpers.mjs';

const LM = path.join(GOLDEN, 'miotts', 'model.gguf');
const CODEC = path.join(GOLDEN, 'miocodec', 'model.gguf');
const VOICE = path.join(ROOT, 'testdata', 'speech_en_48k.wav');
const haveModels = existsSync(LM) && existsSync(CODEC);

let server = null;
let browser = null;

before(async () => {
  if (!haveModels) return;
  server = await startServer(['--tts-model', LM, '--codec', CODEC, '--tts-voice', VOICE,
    '--voices', path.join('/tmp', `voxpipe-e2e-voices-${process.pid}`)]);
  browser = await launch();
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
});

test('TTS console: speaks, plays the audio, shows metrics, cancels', { skip: !haveModels && 'golden models not available' }, async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(server.url + '/tts.html');
  await page.waitForFunction(() => document.querySelector('#model').options.length > 0, null, { timeout: 10_000 });
  assert.equal(await page.locator('#model').inputValue(), 'miotts');

  await page.click('#speak');
  await page.waitForFunction(() => window.voxpipeTTS.done !== null, null, { timeout: 30_000 });
  const done = await page.evaluate(() => window.voxpipeTTS.done);
  assert.equal(done.type, 'done');
  assert.ok(done.metrics.audio_ms > 0, `audio_ms ${done.metrics.audio_ms}`);
  const samples = await page.evaluate(() => window.voxpipeTTS.samples);
  assert.ok(Math.abs(samples / 24 - done.metrics.audio_ms) < 50, `${samples} samples for ${done.metrics.audio_ms} ms`);
  assert.match(await page.textContent('#ttfa'), /\d+ ms/);
  // The audio is playing now: the analyser after the sources hears it.
  let peak = 0;
  for (let i = 0; i < 20 && peak < 0.01; i++) {
    peak = Math.max(peak, await page.evaluate(() => window.voxpipeTTS.level()));
    await sleep(50);
  }
  assert.ok(peak >= 0.01, `output level ${peak}`);

  // A long text, cancelled after its first audio: done says canceled.
  await page.fill('#text', 'This goes on for a while. '.repeat(30));
  const before = await page.evaluate(() => window.voxpipeTTS.samples);
  await page.click('#speak');
  await page.waitForFunction((n) => window.voxpipeTTS.samples > n, before, { timeout: 30_000 });
  await page.click('#cancel');
  await page.waitForFunction(() => window.voxpipeTTS.done !== null, null, { timeout: 10_000 });
  assert.equal(await page.evaluate(() => window.voxpipeTTS.done.canceled), true);
  assert.match(await page.textContent('#status'), /Cancelled/);
  assert.deepEqual(errors, []);
});
