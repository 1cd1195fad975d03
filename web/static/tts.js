// Text-to-speech console: streams text to /v1/tts/ws and plays the 24 kHz PCM it gets back
// as it arrives (docs/protocol.md, "Text to speech over WebSocket").

const RATE = 24000;
// An API key given to the page as ?token=KEY is passed on to every request (servers not on
// localhost require one; docs/api.md).
const TOKEN = new URLSearchParams(location.search).get('token');
function withToken(url) {
  if (!TOKEN) return url;
  return `${url}${url.includes('?') ? '&' : '?'}token=${encodeURIComponent(TOKEN)}`;
}

const $ = (id) => document.getElementById(id);
const ui = {
  conn: $('conn'), text: $('text'), voice: $('voice'), model: $('model'), speak: $('speak'),
  cancel: $('cancel'), status: $('status'), ttfa: $('ttfa'), audio: $('audio'), rtf: $('rtf'),
};

let ws = null;
let ctx = null; // AudioContext, made on the first Speak (browsers need a gesture)
let analyser = null;
let playAt = 0; // AudioContext time where the next chunk starts
let current = null; // context id being spoken
let counter = 0;
let sources = [];

// The page's test reads this: samples received and the output level.
window.voxpipeTTS = { samples: 0, level: () => level(), done: null };

function level() {
  if (!analyser) return 0;
  const buf = new Float32Array(analyser.fftSize);
  analyser.getFloatTimeDomainData(buf);
  let s = 0;
  for (const v of buf) s += v * v;
  return Math.sqrt(s / buf.length);
}

function setConn(state) {
  ui.conn.dataset.state = state;
  ui.conn.textContent = state;
}

function status(msg) {
  ui.status.textContent = msg;
}

async function loadLists() {
  try {
    const res = await fetch(withToken('/v1/voices'));
    const list = await res.json();
    for (const v of list.voices ?? []) {
      const o = document.createElement('option');
      o.value = v.id;
      o.textContent = `${v.name} (${v.seconds} s)`;
      ui.voice.append(o);
    }
    for (const m of list.tts_models ?? []) {
      const o = document.createElement('option');
      o.value = m;
      o.textContent = m;
      ui.model.append(o);
    }
    if (!(list.tts_models ?? []).length) status('No text-to-speech model is loaded: start the server with --tts-model and --codec.');
  } catch (err) {
    status(`Could not list voices: ${err}`);
  }
}

function connect() {
  return new Promise((resolve, reject) => {
    if (ws && ws.readyState === WebSocket.OPEN) return resolve(ws);
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    ws = new WebSocket(withToken(`${proto}//${location.host}/v1/tts/ws`));
    setConn('connecting');
    ws.onopen = () => { setConn('connected'); resolve(ws); };
    ws.onerror = () => reject(new Error('WebSocket error'));
    ws.onclose = () => { setConn('idle'); ws = null; };
    ws.onmessage = (ev) => onMessage(JSON.parse(ev.data));
  });
}

function play(bytes) {
  const n = bytes.length >> 1;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const buf = ctx.createBuffer(1, n, RATE);
  const ch = buf.getChannelData(0);
  for (let i = 0; i < n; i++) ch[i] = view.getInt16(2 * i, true) / 32768;
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(analyser);
  playAt = Math.max(playAt, ctx.currentTime + 0.05); // a little cushion against jitter
  src.start(playAt);
  playAt += buf.duration;
  sources.push(src);
  src.onended = () => { sources = sources.filter((s) => s !== src); };
  window.voxpipeTTS.samples += n;
}

function onMessage(m) {
  if (m.context_id && m.context_id !== current) return; // a cancelled context's leftovers
  switch (m.type) {
    case 'audio': {
      const bin = atob(m.data);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      play(bytes);
      break;
    }
    case 'done':
      ui.ttfa.textContent = `${m.metrics.ttfa_ms.toFixed(0)} ms`;
      ui.audio.textContent = `${(m.metrics.audio_ms / 1000).toFixed(2)} s`;
      ui.rtf.textContent = m.metrics.rtf.toFixed(3);
      status(m.canceled ? 'Cancelled.' : 'Done.');
      window.voxpipeTTS.done = m;
      finish();
      break;
    case 'error':
      status(`Error (${m.code}): ${m.message}`);
      finish();
      break;
  }
}

function finish() {
  current = null;
  ui.speak.disabled = false;
  ui.cancel.disabled = true;
}

async function speak() {
  const text = ui.text.value.trim();
  if (!text) return status('Type some text first.');
  if (!ctx) {
    ctx = new AudioContext({ sampleRate: RATE });
    analyser = ctx.createAnalyser();
    analyser.fftSize = 2048;
    analyser.connect(ctx.destination);
  }
  await ctx.resume();
  try {
    await connect();
  } catch (err) {
    return status(`Cannot connect: ${err.message}`);
  }
  current = `c${++counter}`;
  window.voxpipeTTS.done = null;
  ui.speak.disabled = true;
  ui.cancel.disabled = false;
  ui.ttfa.textContent = ui.audio.textContent = ui.rtf.textContent = '…';
  status('Speaking…');
  const msg = { type: 'speak', context_id: current, text, format: { encoding: 'pcm_s16le', sample_rate: RATE } };
  if (ui.voice.value) msg.voice = ui.voice.value;
  if (ui.model.value) msg.model = ui.model.value;
  ws.send(JSON.stringify(msg));
}

function cancel() {
  if (!current || !ws) return;
  ws.send(JSON.stringify({ type: 'cancel', context_id: current }));
  for (const s of sources) s.stop();
  sources = [];
  playAt = 0;
}

ui.speak.addEventListener('click', speak);
ui.cancel.addEventListener('click', cancel);
loadLists();
