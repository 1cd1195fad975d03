// Real-browser test of the page from another machine: the server listens on this machine's
// LAN address with a self-signed certificate and an API key, and Chromium opens
// https://LAN-IP:PORT/?token=KEY — not localhost, so only HTTPS makes it a secure context
// and lets the page have the microphone. The voice changer must start and return audio.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import { startServer, launch, SPEECH_WAV } from './helpers.mjs';

const KEY = 'e2e-tls-key-0123456789abcdef';
let server = null;
let browser = null;

// lanAddress is a non-loopback IPv4 address of this machine.
function lanAddress() {
  for (const list of Object.values(os.networkInterfaces())) {
    for (const a of list || []) {
      if (a.family === 'IPv4' && !a.internal) return a.address;
    }
  }
  return null;
}

const host = lanAddress();

before(async () => {
  if (!host) return;
  server = await startServer(['--voices', `/tmp/voxpipe-e2e-tls-${process.pid}/voices`, '--api-key', KEY], { host, tls: true });
  // A browser that has accepted the self-signed certificate (what a user clicks through once).
  browser = await launch(SPEECH_WAV, ['--ignore-certificate-errors']);
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
});

test('the page works over TLS from a non-localhost address', { skip: host ? false : 'this machine has no non-loopback IPv4 address' }, async () => {
  assert.match(server.output(), /TLS: self-signed certificate, SHA-256 fingerprint ([0-9A-F]{2}:){31}[0-9A-F]{2}/);
  assert.match(server.output(), /serving on https:\/\//);
  const page = await browser.newPage();
  await page.goto(`${server.url}/?token=${KEY}`);
  assert.equal(await page.evaluate(() => window.isSecureContext), true);
  await page.waitForFunction(() => window.voxpipe && window.voxpipe.state === 'idle', null, { timeout: 5000 });
  await page.click('#start');
  await page.waitForFunction(() => window.voxpipe.lastStats && window.voxpipe.lastStats.packets.received > 20, null, { timeout: 20_000 });
  const st = await page.evaluate(() => window.voxpipe.lastStats);
  assert.equal(st.voice, 'dsp');
  assert.ok(st.latency_ms.server > 0, JSON.stringify(st));
});
