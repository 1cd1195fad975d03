// The official OpenAI Node client against the speech endpoint, with its default arguments:
// model tts-1 and voice alloy stand for the loaded model and the default voice, the
// response is MP3 (OpenAI's default format), /v1/models lists what is loaded, and
// stream_format "sse" gives speech.audio.delta events.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, GOLDEN, ROOT } from './helpers.mjs';

const LM = path.join(GOLDEN, 'miotts', 'model.gguf');
const CODEC = path.join(GOLDEN, 'miocodec', 'model.gguf');
const VOICE = path.join(ROOT, 'testdata', 'speech_en_48k.wav');

let server = null;
let client = null;

before(async () => {
  server = await startServer(['--tts-model', LM, '--codec', CODEC, '--tts-voice', VOICE,
    '--voices', path.join('/tmp', `voxpipe-e2e-openai-${process.pid}`)]);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'not-needed-on-localhost' });
});

after(async () => {
  if (server) await server.stop();
});

test('the official client speaks with its default arguments', { skip: existsSync(LM) ? false : `no golden model at ${LM}` }, async () => {
  const res = await client.audio.speech.create({ model: 'tts-1', voice: 'alloy', input: 'Hello there, this is a test.' });
  assert.equal(res.headers.get('content-type'), 'audio/mpeg');
  const mp3 = Buffer.from(await res.arrayBuffer());
  assert.ok(mp3.length > 1000, `${mp3.length} bytes`);
  assert.equal(mp3[0], 0xff); // an MPEG audio frame sync
  assert.equal(mp3[1] & 0xe0, 0xe0);

  const models = await client.models.list();
  const ids = models.data.map((m) => m.id);
  for (const id of ['miotts', 'tts-1', 'gpt-4o-mini-tts']) assert.ok(ids.includes(id), `models: ${ids}`);

  const sse = await client.audio.speech.create({ model: 'gpt-4o-mini-tts', voice: 'nova', input: 'Hi there.', response_format: 'pcm', stream_format: 'sse', instructions: 'Speak calmly.' });
  const text = await sse.text();
  const events = text.trim().split('\n\n').map((e) => JSON.parse(e.replace(/^data: /, '')));
  assert.equal(events.at(-1).type, 'speech.audio.done');
  const audio = events.filter((e) => e.type === 'speech.audio.delta').map((e) => Buffer.from(e.audio, 'base64'));
  assert.ok(Buffer.concat(audio).length > 2400, 'PCM in the deltas');

  const flac = Buffer.from(await (await client.audio.speech.create({ model: 'tts-1', voice: 'alloy', input: 'Hi there.', response_format: 'flac' })).arrayBuffer());
  assert.equal(flac.subarray(0, 4).toString(), 'fLaC');

  // Errors come back as the client's APIError with OpenAI's error body.
  await assert.rejects(client.audio.speech.create({ model: 'tts-1', voice: 'alloy', input: 'hi', response_format: 'aac' }),
    (e) => e.status === 400 && /aac/.test(e.message));
});
