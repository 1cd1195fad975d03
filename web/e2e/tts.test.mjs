// Real-browser test of the text-to-speech console (web/static/tts.html).
//
// Starts `bin/voxpipe serve` with the tiny golden MioTTS and MioCodec models
// ($VOXPIPE_GOLDEN_DIR or ../shared/golden; the test skips without them) and the speech
// fixture as the default voice, opens the console in Debian's Chromium, presses Speak and
// checks that audio arrives and plays, that the metrics show, and that Cancel stops it.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const SERVER_BIN = path.resolve(ROOT, process.env.VOXPIPE_BIN || 'bin/voxpipe');
const GOLDEN = process.env.VOXPIPE_GOLDEN_DIR || path.resolve(ROOT, '..', 'shared', 'golden');
const LM = path.join(GOLDEN, 'miotts', 'model.gguf');
const CODEC = path.join(GOLDEN, 'miocodec', 'model.gguf');
const VOICE = path.join(ROOT, 'testdata', 'speech_en_48k.wav');
const haveModels = existsSync(LM) && existsSync(CODEC);

let server = null;
let browser = null;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function startServer() {
  const listen = `127.0.0.1:${await freePort()}`;
  const proc = spawn(SERVER_BIN, ['serve', '--listen', listen, '--tts-model', LM, '--codec', CODEC,
    '--tts-voice', VOICE, '--voices', path.join('/tmp', `voxpipe-e2e-voices-${process.pid}`)],
  { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (c) => { log += c; });
  proc.stderr.on('data', (c) => { log += c; });
  const url = `http://${listen}`;
  for (const deadline = Date.now() + 20_000; Date.now() < deadline; await sleep(100)) {
    if (proc.exitCode !== null) throw new Error(`server exited early:\n${log}`);
    try {
      if ((await fetch(url + '/healthz')).ok) return { proc, url, log: () => log };
    } catch { /* not up yet */ }
  }
  proc.kill('SIGKILL');
  throw new Error(`server did not come up:\n${log}`);
}

before(async () => {
  if (!haveModels) return;
  if (!existsSync(SERVER_BIN)) throw new Error(`build ${SERVER_BIN} first (go build -o bin/voxpipe ./cmd/voxpipe)`);
  server = await startServer();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run', '--autoplay-policy=no-user-gesture-required'],
  });
});

after(async () => {
  if (browser) await browser.close();
  if (server) {
    server.proc.kill('SIGTERM');
    await new Promise((r) => server.proc.once('exit', r));
  }
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
