// Real-browser tests of channels and the page's setup controls: the voice changer runs on a
// named channel (fake microphone playing the speech fixture), /obs.html?channel=NAME plays
// whatever session is live on it across Stop/Start and shows idle in between; the copied
// OBS URL, presets and device choices survive a reload; the input meter follows the mic
// and the input gain. The server has two API keys: the other key's OBS page stays idle.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, launch, sleep, SPEECH_WAV } from './helpers.mjs';

const KEY = 'e2e-channel-key-a-0123456789';
const OTHER = 'e2e-channel-key-b-0123456789';
const CHANNEL = 'e2e-studio';

let server = null;
let browser = null;

before(async () => {
  server = await startServer(['--voices', `/tmp/voxpipe-e2e-channel-${process.pid}`, '--api-key', `${KEY},${OTHER}`]);
  browser = await launch(SPEECH_WAV);
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
});

// page opens a voice-changer page in a fresh browser context (its own localStorage).
async function page(query = '', options = {}) {
  const context = await browser.newContext(options);
  const p = await context.newPage();
  const errors = [];
  p.on('pageerror', (e) => errors.push(String(e)));
  await p.goto(`${server.url}/?token=${KEY}${query}`);
  await p.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle', null, { timeout: 5000 });
  return { p, context, errors };
}

async function startSession(p) {
  await p.click('#start');
  await p.waitForFunction(() => window.voxpipe.state === 'connected' && window.voxpipe.lastReady?.channel, null, { timeout: 15_000 });
  return p.evaluate(() => window.voxpipe.lastReady);
}

async function stopSession(p) {
  await p.click('#start'); // labelled Stop
  await p.waitForFunction(() => window.voxpipe.state === 'idle', null, { timeout: 5000 });
}

// peak is the highest of fn's values over ms, or the first that reaches enough.
async function peak(p, fn, ms, enough = Infinity) {
  let top = 0;
  for (const end = Date.now() + ms; Date.now() < end && top < enough; await sleep(50)) {
    top = Math.max(top, await p.evaluate(fn));
  }
  return top;
}

async function obsPlays(obs, session) {
  await obs.waitForFunction((id) => window.voxpipeOBS.state === 'playing' && window.voxpipeOBS.session === id,
    session, { timeout: 15_000 });
  assert.match(await obs.textContent('#status'), new RegExp(`playing channel ${CHANNEL}`));
  const level = await peak(obs, () => window.voxpipeOBS.level(), 10_000, 0.01);
  assert.ok(level >= 0.01, `OBS page output level ${level}`);
}

test('OBS page follows the channel across Stop and Start, idle in between', async () => {
  const { p, context, errors } = await page(`&channel=${CHANNEL}`);
  const obsContext = await browser.newContext();
  const obs = await obsContext.newPage();
  obs.on('pageerror', (e) => errors.push(String(e)));
  try {
    assert.equal(await p.evaluate(() => window.voxpipe.channel), CHANNEL);
    const url = await p.evaluate(() => window.voxpipe.obsURL());
    assert.equal(url, `${server.url}/obs.html?channel=${CHANNEL}&token=${KEY}`);

    // Before Start the channel is idle: the OBS page says so and keeps asking.
    await obs.goto(url);
    await obs.waitForFunction(() => window.voxpipeOBS.state === 'idle', null, { timeout: 10_000 });
    assert.match(await obs.textContent('#status'), /idle/);

    const first = await startSession(p);
    assert.equal(first.channel, CHANNEL);
    await obsPlays(obs, first.session_id);

    // Another key's OBS page on the same name never sees this key's channel.
    const spy = await obsContext.newPage();
    await spy.goto(`${server.url}/obs.html?channel=${CHANNEL}&token=${OTHER}`);
    await spy.waitForFunction(() => window.voxpipeOBS.state === 'idle', null, { timeout: 10_000 });
    await sleep(2500); // a retry or two later it is still idle
    assert.equal(await spy.evaluate(() => window.voxpipeOBS.state), 'idle');
    await spy.close();

    await stopSession(p);
    await obs.waitForFunction(() => window.voxpipeOBS.state === 'idle', null, { timeout: 10_000 });
    const idle = await obs.textContent('#status');
    assert.match(idle, /idle/);
    assert.doesNotMatch(idle, /playing/);
    assert.equal(await obs.evaluate(() => window.voxpipeOBS.session), null);

    // Start again: a new session on the same channel, picked up without reloading OBS.
    const second = await startSession(p);
    assert.notEqual(second.session_id, first.session_id);
    await obsPlays(obs, second.session_id);
    assert.equal(await p.evaluate(() => window.voxpipe.obsURL()), url, 'the OBS URL changed across Stop/Start');
    await stopSession(p);
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
    await obsContext.close();
  }
});

test('copy OBS URL: clipboard, fallback, same URL after a reload; channel names are checked', async () => {
  const { p, context, errors } = await page('', { permissions: ['clipboard-read', 'clipboard-write'] });
  try {
    const channel = await p.evaluate(() => window.voxpipe.channel);
    assert.match(channel, /^[a-z]+-[a-z]+-\d{3}$/, 'a random readable default name');
    const want = `${server.url}/obs.html?channel=${channel}&token=${KEY}`;
    await p.click('#copy-obs');
    await p.waitForFunction(() => document.querySelector('#obs-msg').dataset.kind === 'ok', null, { timeout: 5000 });
    assert.equal(await p.evaluate(() => navigator.clipboard.readText()), want);
    assert.equal(await p.inputValue('#obs-url'), want);

    await p.reload();
    await p.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle');
    assert.equal(await p.evaluate(() => window.voxpipe.channel), channel, 'the channel survives a reload');
    assert.equal(await p.inputValue('#obs-url'), want);

    // Without a clipboard API the URL is selected in its field for Ctrl+C.
    await p.evaluate(() => Object.defineProperty(navigator, 'clipboard', { value: undefined }));
    await p.click('#copy-obs');
    const picked = await p.evaluate(() => {
      const f = document.activeElement;
      return f.id === 'obs-url' ? f.value.slice(f.selectionStart, f.selectionEnd) : '';
    });
    assert.equal(picked, want);

    // A bad name is refused and the old channel stays.
    await p.fill('#channel', 'bad name!');
    await p.press('#channel', 'Enter');
    assert.equal(await p.getAttribute('#channel', 'aria-invalid'), 'true');
    assert.match(await p.textContent('#channel-msg'), /letters, digits/);
    assert.equal(await p.evaluate(() => window.voxpipe.channel), channel);
    await p.fill('#channel', 'renamed.one');
    await p.press('#channel', 'Enter');
    assert.equal(await p.evaluate(() => window.voxpipe.channel), 'renamed.one');
    assert.equal(await p.inputValue('#obs-url'), `${server.url}/obs.html?channel=renamed.one&token=${KEY}`);
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
  }
});

test('presets and device choices survive a reload', async () => {
  const { p, context, errors } = await page();
  try {
    await p.locator('#pitch').fill('5');
    await p.locator('#formant').fill('-2');
    await p.locator('#gain').fill('6');
    await p.check('#noise');
    await p.fill('#preset-name', 'Robot');
    await p.click('#preset-save');
    await p.locator('#pitch').fill('0');
    await p.fill('#preset-name', 'Plain');
    await p.click('#preset-save');

    // Devices: the fake ones are listed once the microphone is allowed.
    await startSession(p);
    await p.waitForFunction(() => document.querySelector('#mic').options.length > 1, null, { timeout: 5000 });
    const mic = await p.evaluate(() => [...document.querySelector('#mic').options].at(-1).value);
    await p.selectOption('#mic', mic);
    const canSink = await p.evaluate(() => !document.querySelector('#speaker').disabled);
    let speaker = '';
    if (canSink) {
      await p.waitForFunction(() => document.querySelector('#speaker').options.length > 1, null, { timeout: 5000 });
      speaker = await p.evaluate(() => [...document.querySelector('#speaker').options].at(-1).value);
      await p.selectOption('#speaker', speaker);
    }
    await sleep(500); // the new microphone is swapped in while the session runs
    assert.equal(await p.evaluate(() => window.voxpipe.state), 'connected');
    await stopSession(p);

    await p.reload();
    await p.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle');
    const names = await p.evaluate(() => [...document.querySelector('#preset').options].map((o) => o.value));
    assert.deepEqual(names, ['', 'Plain', 'Robot']);
    assert.equal(await p.inputValue('#preset'), 'Plain', 'the last preset is selected and applied');
    assert.equal(await p.inputValue('#pitch'), '0');
    await p.selectOption('#preset', 'Robot');
    await p.click('#preset-load');
    assert.equal(await p.inputValue('#pitch'), '5');
    assert.equal(await p.inputValue('#formant'), '-2');
    assert.equal(await p.inputValue('#gain'), '6');
    assert.equal(await p.textContent('#gain-out'), '+6 dB');
    assert.equal(await p.isChecked('#noise'), true);
    assert.equal(await p.isChecked('#echo'), false, 'echo cancellation stays off by default');
    assert.equal(await p.inputValue('#mic'), mic);
    if (canSink) assert.equal(await p.inputValue('#speaker'), speaker);

    await p.click('#preset-delete');
    await p.reload();
    await p.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle');
    assert.deepEqual(await p.evaluate(() => [...document.querySelector('#preset').options].map((o) => o.value)), ['', 'Plain']);
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
  }
});

test('the input meter follows the microphone and the input gain changes what is sent', async (t) => {
  const { p, context, errors } = await page();
  try {
    assert.equal(await p.evaluate(() => window.voxpipe.inputLevel()), 0);
    await startSession(p);
    const span = 3000; // the fixture's speech has pauses: take the loudest moment
    const inAt0 = await peak(p, () => window.voxpipe.inputLevel(), span);
    const outAt0 = await peak(p, () => window.voxpipe.outputLevel(), span);
    assert.ok(inAt0 > 0.01, `input meter ${inAt0} with the fake microphone speaking`);
    // The meter on the page moves too (its aria value is updated twice a second).
    await p.waitForFunction(() => Number(document.querySelector('#in-level').getAttribute('aria-valuenow')) > -60,
      null, { timeout: 5000 });

    await p.locator('#gain').fill('-20');
    assert.equal(await p.textContent('#gain-out'), '−20 dB');
    await sleep(500); // what was sent before has played out
    const inAt20 = await peak(p, () => window.voxpipe.inputLevel(), span);
    const outAt20 = await peak(p, () => window.voxpipe.outputLevel(), span);
    t.diagnostic(`input peak ${inAt0.toFixed(4)} → ${inAt20.toFixed(4)}, output ${outAt0.toFixed(4)} → ${outAt20.toFixed(4)}`);
    assert.ok(inAt20 < inAt0 / 4, `−20 dB: input ${inAt0} → ${inAt20}`);
    assert.ok(outAt20 < outAt0 / 3, `−20 dB: the server got less: output ${outAt0} → ${outAt20}`);
    await stopSession(p);
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
  }
});
