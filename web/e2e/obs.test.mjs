// Real-browser test of the OBS page: a voice-changer session runs in one page (fake mic
// playing the speech fixture) and /obs.html?session=ID in another plays that session's
// output through WHEP.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, launch, sleep, SPEECH_WAV } from './helpers.mjs';

let server = null;
let browser = null;

before(async () => {
  server = await startServer(['--voices', `/tmp/voxpipe-e2e-obs-${process.pid}`]);
  browser = await launch(SPEECH_WAV);
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
});

test('OBS page plays a live session through WHEP', async () => {
  const changer = await browser.newPage();
  await changer.goto(server.url + '/');
  await changer.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle', null, { timeout: 5000 });
  await changer.click('#start');
  await changer.waitForFunction(() => window.voxpipe.lastStats && window.voxpipe.lastStats.session_id, null, { timeout: 15_000 });
  const session = await changer.evaluate(() => window.voxpipe.lastStats.session_id);

  const obs = await browser.newPage();
  const errors = [];
  obs.on('pageerror', (e) => errors.push(String(e)));
  // A wrong session id waits and says so; it does not throw.
  await obs.goto(server.url + '/obs.html?session=nosuch');
  await obs.waitForFunction(() => window.voxpipeOBS.state === 'waiting', null, { timeout: 10_000 });
  assert.match(await obs.textContent('#status'), /404/);

  await obs.goto(server.url + `/obs.html?session=${session}`);
  await obs.waitForFunction(() => window.voxpipeOBS.state === 'playing', null, { timeout: 15_000 });
  let peak = 0;
  for (const deadline = Date.now() + 10_000; Date.now() < deadline && peak < 0.01; await sleep(100)) {
    peak = Math.max(peak, await obs.evaluate(() => window.voxpipeOBS.level()));
  }
  assert.ok(peak >= 0.01, `OBS page output level ${peak}`);
  assert.deepEqual(errors, []);
});
