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
import { startServer, launch, sleep, SPEECH_WAV } from './helpers.mjs';

const SCREENSHOT = '/tmp/voxpipe-page.png';

const LEVEL_THRESHOLD = 0.01; // RMS of the returned audio, about −40 dBFS
const AUDIO_TIMEOUT_MS = 10_000;

let server = null; // { proc, url, output(), stop() }
let browser = null;

before(async () => {
  server = await startServer();
  // The fake microphone loops the file, so speech keeps flowing for the whole test.
  browser = await launch(SPEECH_WAV);
});

after(async () => {
  try {
    if (browser) await browser.close();
  } finally {
    browser = null;
    if (server) await server.stop();
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
