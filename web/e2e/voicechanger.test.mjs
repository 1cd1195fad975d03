// Real-browser end-to-end test of the voice-changer page.
//
// Starts `bin/voxpipe serve` (VOXPIPE_BIN overrides the path), opens the page in Debian's
// Chromium with a fake microphone that plays testdata/speech_en_48k.wav in a loop, clicks
// Start, changes the pitch and checks that processed audio comes back and latency is shown.
//
// Run from the repository root:  go build -o bin/voxpipe ./cmd/voxpipe && node --test web/e2e/
// Needs: /usr/bin/chromium (CHROMIUM_PATH overrides) and `npm install` (playwright-core).

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
const SPEECH_WAV = path.join(ROOT, 'testdata', 'speech_en_48k.wav');
const SCREENSHOT = '/tmp/voxpipe-page.png';

const LEVEL_THRESHOLD = 0.01; // RMS of the returned audio, about −40 dBFS
const AUDIO_TIMEOUT_MS = 10_000;

let server = null; // { proc, url, output() }
let browser = null;

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

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function startServer() {
  const port = await freePort();
  const listen = `127.0.0.1:${port}`;
  const proc = spawn(SERVER_BIN, ['serve', '--listen', listen], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  const keep = (chunk) => {
    log += chunk.toString();
    if (log.length > 64_000) log = log.slice(-32_000);
  };
  proc.stdout.on('data', keep);
  proc.stderr.on('data', keep);
  let exited = null;
  proc.on('exit', (code, signal) => {
    exited = { code, signal };
  });
  const spawnError = new Promise((_, reject) => proc.on('error', reject));
  spawnError.catch(() => {});

  const url = `http://${listen}`;
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (exited) {
      throw new Error(`${SERVER_BIN} exited early (${JSON.stringify(exited)}); output:\n${log}`);
    }
    for (const p of ['/healthz', '/']) {
      try {
        const res = await Promise.race([fetch(url + p), spawnError]);
        if (res.ok) return { proc, url, output: () => log };
      } catch (err) {
        if (err && err.code === 'ENOENT') throw new Error(`cannot run ${SERVER_BIN}: ${err.message}`);
      }
    }
    await sleep(100);
  }
  proc.kill('SIGKILL');
  throw new Error(`${SERVER_BIN} did not answer on ${url} within 20 s; output:\n${log}`);
}

async function stopServer() {
  if (!server) return;
  const { proc } = server;
  server = null;
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const gone = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), 3000);
  await gone;
  clearTimeout(timer);
}

before(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium not found at ${CHROMIUM}. Install it (Debian: apt-get install -y chromium) ` +
        'or point CHROMIUM_PATH at a Chromium binary. This test does not skip without it.',
    );
  }
  if (!existsSync(SERVER_BIN)) {
    throw new Error(`server binary ${SERVER_BIN} not found: build it first (go build -o bin/voxpipe ./cmd/voxpipe)`);
  }
  if (!existsSync(SPEECH_WAV)) throw new Error(`missing fixture ${SPEECH_WAV}`);

  server = await startServer();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless=new',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      '--use-fake-ui-for-media-stream',
      '--use-fake-device-for-media-stream',
      // No %noloop: the file loops, so speech keeps flowing for the whole test.
      `--use-file-for-fake-audio-capture=${SPEECH_WAV}`,
      '--autoplay-policy=no-user-gesture-required',
      '--disable-features=WebRtcHideLocalIpsWithMdns',
    ],
  });
});

after(async () => {
  try {
    if (browser) await browser.close();
  } finally {
    browser = null;
    await stopServer();
  }
});

test('voice changer page: connects, returns processed audio, shows latency', async (t) => {
  const context = await browser.newContext({ viewport: { width: 420, height: 900 } });
  const page = await context.newPage();
  const consoleLines = [];
  page.on('console', (m) => consoleLines.push(`[${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => consoleLines.push(`[pageerror] ${e.message}`));

  const diagnose = async (what) => {
    let status = '?';
    let state = '?';
    try {
      status = await page.locator('#status').textContent();
      state = await page.evaluate(() => window.voxpipe && window.voxpipe.state);
    } catch {}
    return (
      `${what}\n  page state: ${state}\n  status line: ${status}\n` +
      `  browser console:\n    ${consoleLines.slice(-30).join('\n    ') || '(empty)'}\n` +
      `  server output (tail):\n${(server ? server.output() : '').slice(-4000)}`
    );
  };

  try {
    await page.goto(server.url + '/');
    await page.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle', null, { timeout: 5000 });

    await page.click('#start');
    try {
      await page.waitForFunction(() => window.voxpipe.state === 'connected', null, { timeout: 15_000 });
    } catch {
      assert.fail(await diagnose('the page did not reach state "connected" within 15 s'));
    }

    await page.locator('#pitch').fill('4');
    assert.equal(await page.locator('#pitch-out').textContent(), '+4 st');

    // Poll the output level and the latency readout for up to AUDIO_TIMEOUT_MS.
    let maxLevel = 0;
    let latencyText = '';
    const deadline = Date.now() + AUDIO_TIMEOUT_MS;
    while (Date.now() < deadline) {
      const level = await page.evaluate(() => window.voxpipe.outputLevel());
      maxLevel = Math.max(maxLevel, level);
      latencyText = (await page.locator('#latency').textContent()).trim();
      if (maxLevel > LEVEL_THRESHOLD && /^\d+(\.\d+)? ms$/.test(latencyText)) break;
      await sleep(100);
    }
    t.diagnostic(`max output RMS ${maxLevel.toFixed(4)}, latency "${latencyText}"`);
    if (!(maxLevel > LEVEL_THRESHOLD)) {
      assert.fail(await diagnose(`no audio came back: max output RMS ${maxLevel.toFixed(5)} <= ${LEVEL_THRESHOLD}`));
    }
    if (!/^\d+(\.\d+)? ms$/.test(latencyText)) {
      assert.fail(await diagnose(`#latency shows "${latencyText}", not a number of ms (no stats from the server?)`));
    }
    const load = (await page.locator('#load').textContent()).trim();
    assert.match(load, /^\d+(\.\d+)? %$/, `#load shows "${load}"`);

    const statusKind = await page.locator('#status').getAttribute('data-kind');
    if (statusKind === 'error') assert.fail(await diagnose('the page shows an error'));

    const stats = await page.evaluate(() => window.voxpipe.lastStats);
    t.diagnostic(`server stats: ${JSON.stringify(stats)}`);
    t.diagnostic(`browser stats: ${JSON.stringify(await page.evaluate(() => window.voxpipe.browserStats))}`);

    assert.equal(stats && stats.voice, 'dsp', 'stats should report the dsp voice');

    // Screenshot (for a look at the page) at a moment the meter shows audio, if one comes.
    await page
      .waitForFunction((min) => window.voxpipe.outputLevel() > min, LEVEL_THRESHOLD * 3, { timeout: 4000 })
      .catch(() => {});
    await sleep(100); // let the meter's animation frame catch up
    await page.screenshot({ path: SCREENSHOT, fullPage: true });

    await page.click('#start'); // now labelled Stop
    await page.waitForFunction(() => window.voxpipe.state === 'idle', null, { timeout: 5000 });
    assert.equal(await page.evaluate(() => window.voxpipe.outputLevel()), 0);
  } finally {
    await context.close();
  }
});
