// Real-browser test of WHIP from a page on another origin (RFC 9725 §4.4/4.5): the browser
// preflights POST and DELETE, sends the key as a bearer token, reads the Location of the
// session it made, and ends it.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, launch, freePort } from './helpers.mjs';

const KEY = 'e2e-cors-key-0123456789abcdef';
let server = null;
let browser = null;
let page = null; // a blank page served from another origin
let pageServer = null;

before(async () => {
  server = await startServer(['--voices', `/tmp/voxpipe-e2e-cors-${process.pid}`, '--api-key', KEY]);
  browser = await launch();
  const port = await freePort();
  pageServer = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end('<!doctype html><title>another origin</title>');
  });
  await new Promise((r) => pageServer.listen(port, '127.0.0.1', r));
  page = `http://localhost:${port}/`; // localhost vs the server's 127.0.0.1: another origin
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
  if (pageServer) pageServer.close();
});

test('a WHIP client on another origin starts and ends a session', async () => {
  const tab = await browser.newPage();
  await tab.goto(page);
  const got = await tab.evaluate(async ({ base, key }) => {
    const pc = new RTCPeerConnection();
    pc.addTransceiver('audio', { direction: 'sendonly' });
    await pc.setLocalDescription(await pc.createOffer());
    const res = await fetch(`${base}/v1/whip?voice=dsp`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/sdp', Authorization: `Bearer ${key}` },
      body: pc.localDescription.sdp,
    });
    const location = res.headers.get('Location');
    const answer = await res.text();
    const out = { status: res.status, location, answerIsSDP: answer.startsWith('v=0') };
    if (location) {
      const del = await fetch(new URL(location, base), { method: 'DELETE', headers: { Authorization: `Bearer ${key}` } });
      out.deleted = del.status;
    }
    // Without the key the browser still reads the server's refusal (no CORS failure).
    const anon = await fetch(`${base}/v1/whip?voice=dsp`, { method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: 'v=0' });
    out.anonymous = anon.status;
    pc.close();
    return out;
  }, { base: server.url, key: KEY });
  assert.equal(got.status, 201, JSON.stringify(got));
  assert.match(got.location || '', /^\/v1\/whip\//);
  assert.ok(got.answerIsSDP, 'the answer is SDP');
  assert.ok(got.deleted >= 200 && got.deleted < 300, `DELETE: ${got.deleted}`);
  assert.equal(got.anonymous, 401);
});
