// Shared by the browser tests: a free port, the server binary started on it, Chromium.

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
export const SERVER_BIN = path.resolve(ROOT, process.env.VOXPIPE_BIN || 'bin/voxpipe');
export const GOLDEN = process.env.VOXPIPE_GOLDEN_DIR || path.resolve(ROOT, '..', 'shared', 'golden');
export const SPEECH_WAV = path.join(ROOT, 'testdata', 'speech_en_48k.wav');
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
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

// healthy reports whether url/healthz answers 200 (over HTTPS without checking the
// certificate: the tests' servers are self-signed).
function healthy(url) {
  if (!url.startsWith('https:')) return fetch(url + '/healthz').then((r) => r.ok);
  return new Promise((resolve, reject) => {
    https.get(url + '/healthz', { rejectUnauthorized: false }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    }).on('error', reject);
  });
}

// startServer runs `voxpipe serve` with extra arguments until /healthz answers; host is the
// address it listens on, tls serves HTTPS with a self-signed certificate.
export async function startServer(args = [], { host = '127.0.0.1', tls = false } = {}) {
  if (!existsSync(SERVER_BIN)) {
    throw new Error(`server binary ${SERVER_BIN} not found: build it first (go build -o bin/voxpipe ./cmd/voxpipe)`);
  }
  const listen = `${host}:${await freePort()}`;
  if (tls) args = [...args, '--tls-self-signed'];
  const proc = spawn(SERVER_BIN, ['serve', '--listen', listen, ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const keep = (c) => {
    log += c;
    if (log.length > 64_000) log = log.slice(-32_000);
  };
  proc.stdout.on('data', keep);
  proc.stderr.on('data', keep);
  const url = `${tls ? 'https' : 'http'}://${listen}`;
  for (const deadline = Date.now() + 20_000; Date.now() < deadline; await sleep(100)) {
    if (proc.exitCode !== null) throw new Error(`server exited early:\n${log}`);
    try {
      if (await healthy(url)) {
        return {
          proc, url, output: () => log,
          async stop() {
            if (proc.exitCode !== null) return;
            const gone = new Promise((r) => proc.once('exit', r));
            proc.kill('SIGTERM');
            const t = setTimeout(() => proc.kill('SIGKILL'), 3000);
            await gone;
            clearTimeout(t);
          },
        };
      }
    } catch { /* not up yet */ }
  }
  proc.kill('SIGKILL');
  throw new Error(`server did not come up on ${url}:\n${log}`);
}

// launch starts headless Chromium; a fake microphone plays wav when given.
export function launch(wav, extraArgs = []) {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`Chromium not found at ${CHROMIUM}. Install it (Debian: apt-get install -y chromium) ` +
      'or point CHROMIUM_PATH at a Chromium binary. The browser tests do not skip without it.');
  }
  if (wav && !existsSync(wav)) throw new Error(`missing fixture ${wav}`);
  const args = ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--autoplay-policy=no-user-gesture-required',
    '--disable-features=WebRtcHideLocalIpsWithMdns'];
  args.push(...extraArgs);
  if (wav) args.push('--use-fake-ui-for-media-stream', '--use-fake-device-for-media-stream', `--use-file-for-fake-audio-capture=${wav}`);
  return chromium.launch({ executablePath: CHROMIUM, args });
}
