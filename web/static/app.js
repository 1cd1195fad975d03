// voxpipe live voice changer: microphone → WebRTC → server voice processing → speakers.
// Plain ES module, no dependencies. Signaling protocol: docs/protocol.md (WebSocket /v1/rtc).

// An API key given to the page as ?token=KEY is passed on to every request (servers not on
// localhost require one; docs/api.md).
const TOKEN = new URLSearchParams(location.search).get('token');
function withToken(url) {
  if (!TOKEN) return url;
  return `${url}${url.includes('?') ? '&' : '?'}token=${encodeURIComponent(TOKEN)}`;
}

const $ = (id) => document.getElementById(id);

const ui = {
  start: $('start'),
  echo: $('echo'),
  status: $('status'),
  conn: $('conn'),
  voice: $('voice'),
  pitch: $('pitch'),
  pitchOut: $('pitch-out'),
  formant: $('formant'),
  formantOut: $('formant-out'),
  passthrough: $('passthrough'),
  reset: $('reset'),
  latency: $('latency'),
  latencyLabel: $('latency-label'),
  load: $('load'),
  level: $('level'),
  levelFill: document.querySelector('#level .fill'),
  latServer: $('lat-server'),
  latAlgo: $('lat-algo'),
  rtt: $('rtt'),
  jb: $('jb'),
  queue: $('queue'),
  cushion: $('cushion'),
  lateDropped: $('late-dropped'),
  loss: $('loss'),
  remote: $('remote'),
  target: $('target'),
  ref: $('ref'),
  refName: $('ref-name'),
  refFile: $('ref-file'),
  refUpload: $('ref-upload'),
  refMsg: $('ref-msg'),
  channel: $('channel'),
  channelMsg: $('channel-msg'),
  obsURL: $('obs-url'),
  copyOBS: $('copy-obs'),
  obsMsg: $('obs-msg'),
  mic: $('mic'),
  speaker: $('speaker'),
  speakerNote: $('speaker-note'),
  gain: $('gain'),
  gainOut: $('gain-out'),
  noise: $('noise'),
  agc: $('agc'),
  inLevel: $('in-level'),
  inLevelFill: document.querySelector('#in-level .fill'),
  preset: $('preset'),
  presetName: $('preset-name'),
  presetLoad: $('preset-load'),
  presetSave: $('preset-save'),
  presetDelete: $('preset-delete'),
  presetMsg: $('preset-msg'),
};

const query = new URLSearchParams(location.search);

// Opus parameters written into the offer's fmtp line (what we ask the server to send us).
const OFFER_OPUS = { minptime: '10', useinbandfec: '1', stereo: '0', maxaveragebitrate: '32000' };
// Parameters added to the answer's fmtp line where the server left them out; they configure
// the browser's own encoder (FEC on, mono, capped bitrate). Values the server set are kept.
const ANSWER_OPUS = { useinbandfec: '1', stereo: '0', maxaveragebitrate: '32000' };
const SEND_INTERVAL_MS = 50; // control changes are sent at most this often
// Fixed codec delays the measurements miss, added to the round-trip estimate: the browser's
// Opus packetization (one 20 ms frame) and the look-ahead of both Opus encoders (6.5 ms each;
// the server's latency figure excludes the codecs).
const CODEC_DELAY_MS = 20 + 2 * 6.5;
const PING_INTERVAL_MS = 20000;
// Voices known to take the pitch/formant parameters. The server refuses parameters for a
// voice that has none (bad_params), so other voices are sent without them.
const TUNABLE_VOICES = new Set(['dsp']);
// Voices whose target is a reference clip from the voice library, sent as `ref`: those the
// server lists with needs_ref (GET /v1/voices "live_voices"), and every MeanVC2 voice
// (meanvc2, meanvc2-120ms, meanvc2-40ms) should the list not have come.
const REF_VOICES = new Set(['meanvc2']);
function needsRef(name) {
  const v = liveVoices.get(name);
  if (v && typeof v.needs_ref === 'boolean') return v.needs_ref;
  return REF_VOICES.has(name) || /^meanvc2(-|$)/.test(name);
}
// The server's details of its live voices by name: label, algorithmic latency, needs_ref.
const liveVoices = new Map();

let current = null; // the running session, or null
let channel = ''; // the channel the session is live on (OBS plays it by name); set below
let state = 'idle'; // idle | starting | connecting | connected | failed
let lastStats = null; // last `stats` message from the server
let lastReady = null; // last `ready` message from the server
let browserStats = null; // derived from RTCPeerConnection.getStats()

// ---------------------------------------------------------------------------------------
// SDP munging

// mungeOpus sets Opus fmtp parameters in every audio m-section that offers Opus. With
// override=false, parameters already present are kept and only missing ones are added.
export function mungeOpus(sdp, params, override = true) {
  const lines = sdp.split(/\r?\n/);
  const opusPTs = [];
  lines.forEach((line, i) => {
    const m = /^a=rtpmap:(\d+) opus\/48000(?:\/\d+)?$/i.exec(line);
    if (m) opusPTs.push({ pt: m[1], rtpmapIndex: i });
  });
  // Walk from the end so inserting lines does not shift the indexes still to visit.
  for (const { pt, rtpmapIndex } of opusPTs.reverse()) {
    const prefix = `a=fmtp:${pt} `;
    const idx = lines.findIndex((l) => l.startsWith(prefix));
    const fmtp = new Map();
    if (idx >= 0) {
      for (const kv of lines[idx].slice(prefix.length).split(';')) {
        const [k, ...rest] = kv.trim().split('=');
        if (k) fmtp.set(k, rest.join('='));
      }
    }
    for (const [k, v] of Object.entries(params)) {
      if (override || !fmtp.has(k)) fmtp.set(k, v);
    }
    const line = prefix + [...fmtp].map(([k, v]) => (v === '' ? k : `${k}=${v}`)).join(';');
    if (idx >= 0) lines[idx] = line;
    else lines.splice(rtpmapIndex + 1, 0, line);
  }
  return lines.join('\r\n');
}

// ---------------------------------------------------------------------------------------
// UI helpers

function setState(next) {
  state = next;
  ui.conn.textContent = next;
  ui.conn.dataset.state = next;
  const running = current !== null;
  ui.start.textContent = running ? 'Stop' : 'Start';
  ui.start.setAttribute('aria-pressed', String(running));
}

function setStatus(text, kind = 'info') {
  ui.status.textContent = text;
  ui.status.dataset.kind = kind;
}

function fmtSemitones(v) {
  const n = Number(v);
  return `${n > 0 ? '+' : n < 0 ? '−' : ''}${Math.abs(n)} st`;
}

function fmtMs(v, digits = 0) {
  return Number.isFinite(v) ? `${v.toFixed(digits)} ms` : '–';
}

function updateOutputs() {
  ui.pitchOut.textContent = fmtSemitones(ui.pitch.value);
  ui.formantOut.textContent = fmtSemitones(ui.formant.value);
  const tunable = TUNABLE_VOICES.has(ui.voice.value);
  ui.pitch.disabled = !tunable;
  ui.formant.disabled = !tunable;
  ui.target.hidden = !needsRef(ui.voice.value);
}

// processing is the browser's own microphone processing the user chose. Echo cancellation
// is off by default: it distorts the changed voice (headphones need none).
function processing() {
  return {
    echoCancellation: ui.echo.checked,
    noiseSuppression: ui.noise.checked,
    autoGainControl: ui.agc.checked,
    channelCount: 1,
  };
}

// micConstraints asks for the chosen microphone if it is there (ideal: a device unplugged
// since it was saved falls back to the default rather than failing).
function micConstraints() {
  const c = processing();
  if (ui.mic.value) c.deviceId = { ideal: ui.mic.value };
  return c;
}

// iceServers are the server's STUN/TURN servers (serve --ice-server, GET /v1/rtc/config)
// and any the URL adds (?stun=HOST:PORT).
async function iceServers() {
  const fromURL = query
    .getAll('stun')
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter(Boolean)
    .map((v) => ({ urls: /^stuns?:/.test(v) ? v : `stun:${v}` }));
  try {
    const r = await fetch(withToken('/v1/rtc/config'));
    if (r.ok) return [...((await r.json()).ice_servers || []), ...fromURL];
  } catch {
    // an older server: the URL's alone
  }
  return fromURL;
}

function socketURL() {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${scheme}//${location.host}/v1/rtc`;
}

// voiceText is a voice's entry in the picker: its label and the algorithmic latency a
// session with it reports, so a user can pick low latency or quality.
export function voiceText(v) {
  const label = v.label || v.name;
  const lat = Number(v.algorithmic_latency_ms);
  return lat > 0 ? `${label} — ${Math.round(lat)} ms` : label;
}

function ensureVoiceOption(name, text) {
  if (!name) return;
  let opt = [...ui.voice.options].find((o) => o.value === name);
  if (!opt) {
    opt = document.createElement('option');
    opt.value = name;
    opt.textContent = name;
    ui.voice.append(opt);
  }
  if (text) opt.textContent = text;
}

// ---------------------------------------------------------------------------------------
// Signaling

function send(s, msg) {
  if (s.ws && s.ws.readyState === WebSocket.OPEN) {
    s.ws.send(JSON.stringify(msg));
    return true;
  }
  return false;
}

function sessionMessage() {
  const msg = { type: 'session', mode: 'vc', voice: ui.voice.value, passthrough: ui.passthrough.checked, channel };
  if (TUNABLE_VOICES.has(msg.voice)) {
    msg.params = {
      pitch_semitones: Number(ui.pitch.value),
      formant_shift: Number(ui.formant.value),
    };
  }
  // No ref: the server's default target voice (or an error saying one is needed).
  if (needsRef(msg.voice) && ui.ref.value) msg.ref = ui.ref.value;
  return msg;
}

function sendSession(s) {
  const msg = sessionMessage();
  const text = JSON.stringify(msg);
  if (text === s.lastSession) return;
  if (send(s, msg)) s.lastSession = text;
}

// Control changes: the first change goes out at once, further ones at most every
// SEND_INTERVAL_MS, and the final value is always sent.
let sendTimer = null;
let lastSendAt = -Infinity;
function controlsChanged() {
  updateOutputs();
  if (!current || sendTimer !== null) return;
  const wait = Math.max(0, lastSendAt + SEND_INTERVAL_MS - performance.now());
  sendTimer = setTimeout(() => {
    sendTimer = null;
    lastSendAt = performance.now();
    if (current) sendSession(current);
  }, wait);
}

function openSocket(url) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(withToken(url));
    const onOpen = () => {
      ws.removeEventListener('error', onFail);
      ws.removeEventListener('close', onFail);
      resolve(ws);
    };
    const onFail = () => reject(new Error(`could not open ${url}`));
    ws.addEventListener('open', onOpen, { once: true });
    ws.addEventListener('error', onFail, { once: true });
    ws.addEventListener('close', onFail, { once: true });
  });
}

async function onMessage(s, data) {
  if (s !== current) return;
  let msg;
  try {
    msg = JSON.parse(data);
  } catch {
    setStatus('Server sent a message that is not JSON', 'error');
    return;
  }
  switch (msg.type) {
    case 'answer': {
      const sdp = mungeOpus(msg.sdp, ANSWER_OPUS, false);
      try {
        await s.pc.setRemoteDescription({ type: 'answer', sdp });
      } catch {
        await s.pc.setRemoteDescription({ type: 'answer', sdp: msg.sdp });
      }
      for (const r of s.pc.getReceivers()) lowLatency(r);
      const pending = s.pendingRemote.splice(0);
      for (const c of pending) await addRemoteCandidate(s, c);
      break;
    }
    case 'candidate':
      if (!msg.candidate || !msg.candidate.candidate) break; // end of candidates
      if (!s.pc.remoteDescription) s.pendingRemote.push(msg.candidate);
      else await addRemoteCandidate(s, msg.candidate);
      break;
    case 'ready':
      lastReady = msg;
      ensureVoiceOption(msg.voice);
      if (state === 'connected') setStatus(`Live — voice ${msg.voice}`, 'ok');
      renderStats();
      break;
    case 'stats':
      lastStats = msg;
      renderStats();
      break;
    case 'error':
      setStatus(`Server error${msg.code ? ` (${msg.code})` : ''}: ${msg.message || 'unknown'}`, 'error');
      if (msg.fatal) {
        s.fatal = true;
        fail(s, null);
      }
      break;
    case 'pong':
      break;
    default:
      break; // newer servers may send more; ignore what we do not know
  }
}

async function addRemoteCandidate(s, c) {
  try {
    await s.pc.addIceCandidate(c);
  } catch (err) {
    console.warn('voxpipe: addIceCandidate failed', c, err);
  }
}

// ---------------------------------------------------------------------------------------
// Media

function lowLatency(receiver) {
  if (!receiver || !receiver.track || receiver.track.kind !== 'audio') return;
  try {
    if ('jitterBufferTarget' in receiver) receiver.jitterBufferTarget = 0;
    else if ('playoutDelayHint' in receiver) receiver.playoutDelayHint = 0;
  } catch (err) {
    console.warn('voxpipe: could not lower the jitter buffer target', err);
  }
}

function onTrack(s, ev) {
  if (s !== current || ev.track.kind !== 'audio') return;
  lowLatency(ev.receiver);
  const stream = ev.streams[0] || new MediaStream([ev.track]);
  // The element plays the audio. (Chrome also needs a remote stream attached to a media
  // element before Web Audio sees any samples from it.)
  ui.remote.srcObject = stream;
  ui.remote.play().catch(() => {
    setStatus('The browser blocked playback — click the page to hear the output.', 'error');
    document.addEventListener('click', () => ui.remote.play().catch(() => {}), { once: true });
  });
  try {
    const src = s.ctx.createMediaStreamSource(stream);
    const analyser = s.ctx.createAnalyser();
    analyser.fftSize = 2048;
    const mute = s.ctx.createGain();
    mute.gain.value = 0; // keeps the graph pulled without playing the audio twice
    src.connect(analyser).connect(mute).connect(s.ctx.destination);
    s.analyser = analyser;
    s.levelBuf = new Float32Array(analyser.fftSize);
  } catch (err) {
    console.warn('voxpipe: level meter unavailable', err);
  }
}

function rmsOf(analyser, buf) {
  if (!analyser) return 0;
  analyser.getFloatTimeDomainData(buf);
  let sum = 0;
  for (const x of buf) sum += x * x;
  return Math.sqrt(sum / buf.length);
}

// outputLevel is the RMS of the audio coming back; inputLevel of the audio sent (after the
// input gain).
export function outputLevel() {
  return current ? rmsOf(current.analyser, current.levelBuf) : 0;
}

export function inputLevel() {
  return current ? rmsOf(current.inAnalyser, current.inBuf) : 0;
}

function paintMeter(meter, fill, rms, aria) {
  const db = rms > 0 ? 20 * Math.log10(rms) : -Infinity;
  const pct = Math.max(0, Math.min(1, (db + 60) / 60));
  fill.style.width = `${(pct * 100).toFixed(1)}%`;
  if (aria) {
    const v = Number.isFinite(db) ? Math.max(-60, Math.round(db)) : -60;
    meter.setAttribute('aria-valuenow', String(v));
    meter.setAttribute('aria-valuetext', v <= -60 ? 'silent' : `${v} dB`);
  }
}

let meterFrame = 0;
let meterAriaAt = 0;
function drawMeter() {
  meterFrame = requestAnimationFrame(drawMeter);
  const now = performance.now();
  const aria = now - meterAriaAt > 500; // screen readers need no 60 updates a second
  if (aria) meterAriaAt = now;
  paintMeter(ui.level, ui.levelFill, outputLevel(), aria);
  paintMeter(ui.inLevel, ui.inLevelFill, inputLevel(), aria);
}

// ---------------------------------------------------------------------------------------
// Statistics

async function pollBrowserStats(s) {
  if (s !== current || !s.pc) return;
  let report;
  try {
    report = await s.pc.getStats();
  } catch {
    return;
  }
  if (s !== current) return;
  let inbound = null;
  let pair = null;
  let transport = null;
  let playout = null;
  let remoteInbound = null;
  report.forEach((r) => {
    if (r.type === 'inbound-rtp' && r.kind === 'audio') inbound = r;
    else if (r.type === 'transport') transport = r;
    else if (r.type === 'candidate-pair' && r.nominated && r.state === 'succeeded') pair = pair || r;
    else if (r.type === 'media-playout') playout = r;
    else if (r.type === 'remote-inbound-rtp' && r.kind === 'audio') remoteInbound = r;
  });
  if (transport && transport.selectedCandidatePairId) {
    pair = report.get(transport.selectedCandidatePairId) || pair;
  }

  const prev = s.prevStats || {};
  const next = {};
  const b = {};
  let rtt = pair && pair.currentRoundTripTime;
  if (!Number.isFinite(rtt) && remoteInbound) rtt = remoteInbound.roundTripTime;
  if (Number.isFinite(rtt)) b.rtt_ms = rtt * 1000;

  if (inbound && Number.isFinite(inbound.jitterBufferDelay) && inbound.jitterBufferEmittedCount > 0) {
    next.jbDelay = inbound.jitterBufferDelay;
    next.jbCount = inbound.jitterBufferEmittedCount;
    const dCount = next.jbCount - (prev.jbCount || 0);
    const dDelay = next.jbDelay - (prev.jbDelay || 0);
    // Mean over the last interval where there is one, otherwise since the start.
    b.jitter_buffer_ms = (dCount > 0 ? dDelay / dCount : next.jbDelay / next.jbCount) * 1000;
  }
  if (inbound) {
    b.packets_received = inbound.packetsReceived;
    b.packets_lost = inbound.packetsLost;
    b.concealed_samples = inbound.concealedSamples;
  }
  if (playout && playout.totalSamplesCount > 0 && Number.isFinite(playout.totalPlayoutDelay)) {
    next.playDelay = playout.totalPlayoutDelay;
    next.playCount = playout.totalSamplesCount;
    const dCount = next.playCount - (prev.playCount || 0);
    const dDelay = next.playDelay - (prev.playDelay || 0);
    b.playout_ms = (dCount > 0 ? dDelay / dCount : next.playDelay / next.playCount) * 1000;
  }
  s.prevStats = next;
  browserStats = b;
  renderStats();
}

function renderStats() {
  const st = lastStats || {};
  const lat = st.latency_ms || {};
  const b = browserStats || {};
  const algo = Number.isFinite(lat.algorithmic) ? lat.algorithmic : lastReady && lastReady.algorithmic_latency_ms;
  // Round trip: the server's measured part plus what the browser measures of its own.
  if (Number.isFinite(lat.server) && Number.isFinite(b.rtt_ms) && Number.isFinite(b.jitter_buffer_ms)) {
    b.round_trip_ms = lat.server + b.rtt_ms + b.jitter_buffer_ms + (b.playout_ms || 0) + CODEC_DELAY_MS;
  }

  if (Number.isFinite(b.round_trip_ms)) {
    ui.latency.textContent = `${Math.round(b.round_trip_ms)} ms`;
    ui.latencyLabel.textContent = 'round trip (est.)';
  } else if (Number.isFinite(lat.server)) {
    ui.latency.textContent = `${Math.round(lat.server)} ms`;
    ui.latencyLabel.textContent = 'server latency';
  } else {
    ui.latency.textContent = '– ms';
  }
  ui.load.textContent = Number.isFinite(st.load) ? `${(st.load * 100).toFixed(1)} %` : '– %';
  ui.latServer.textContent = fmtMs(lat.server, 1);
  ui.latAlgo.textContent = fmtMs(algo, 1);
  ui.rtt.textContent = fmtMs(b.rtt_ms, 1);
  ui.jb.textContent = Number.isFinite(b.playout_ms)
    ? `${fmtMs(b.jitter_buffer_ms, 1)} + ${fmtMs(b.playout_ms, 1)} out`
    : fmtMs(b.jitter_buffer_ms, 1);
  const q = st.queue || {};
  ui.queue.textContent = fmtMs(q.depth_ms, 1);
  // The adaptive output cushion the server holds against slow model steps (and what it has
  // trimmed, in all, to shrink it back).
  ui.cushion.textContent = Number.isFinite(q.output_buffer_ms)
    ? fmtMs(q.output_buffer_ms, 1) + (q.trimmed_ms > 0 ? ` (${Math.round(q.trimmed_ms)} ms trimmed)` : '')
    : '–';
  if (lastStats) {
    ui.lateDropped.textContent =
      `${st.late_chunks ?? 0} / ${st.dropped_chunks ?? 0}` + (st.dropped_ms ? ` (${Math.round(st.dropped_ms)} ms)` : '');
    const p = st.packets || {};
    const total = (p.received || 0) + (p.lost || 0);
    const pct = total > 0 ? (100 * (p.lost || 0)) / total : 0;
    ui.loss.textContent = `${pct.toFixed(1)} % (${p.lost || 0} lost, ${p.fec_recovered || 0} FEC)`;
  } else {
    ui.lateDropped.textContent = '–';
    ui.loss.textContent = '–';
  }
}

// ---------------------------------------------------------------------------------------
// Session lifecycle

function onPeerState(s) {
  if (s !== current) return;
  switch (s.pc.connectionState) {
    case 'connected':
      setState('connected');
      setStatus(`Live — voice ${(lastReady && lastReady.voice) || ui.voice.value}`, 'ok');
      break;
    case 'disconnected':
      setState('connecting');
      setStatus('Connection interrupted, waiting for it to recover…');
      break;
    case 'failed':
      fail(s, new Error('the media connection failed (ICE/DTLS); check the network or add ?stun=…'));
      break;
    case 'closed':
      break;
    default:
      if (state !== 'connected') setState('connecting');
  }
}

function teardown(s) {
  s.closed = true;
  clearInterval(s.statsTimer);
  clearInterval(s.pingTimer);
  if (s.ws) {
    s.ws.onmessage = null;
    s.ws.onclose = null;
    try {
      s.ws.close(1000, 'stop');
    } catch {}
  }
  if (s.pc) s.pc.close();
  if (s.stream) for (const t of s.stream.getTracks()) t.stop();
  if (s.sent) s.sent.stop();
  if (s.ctx) s.ctx.close().catch(() => {});
  if (current === s) current = null;
  ui.remote.srcObject = null;
  cancelAnimationFrame(meterFrame);
  paintMeter(ui.level, ui.levelFill, 0, true);
  paintMeter(ui.inLevel, ui.inLevelFill, 0, true);
}

function fail(s, err) {
  if (s !== current) return;
  teardown(s);
  setState('failed');
  if (err) setStatus(`Error: ${err.message || err}`, 'error');
}

export function stop() {
  const s = current;
  if (!s) return;
  teardown(s);
  setState('idle');
  setStatus('Stopped.');
}

export async function start() {
  if (current) return;
  const s = {
    ws: null,
    pc: null,
    stream: null,
    ctx: null,
    analyser: null,
    levelBuf: null,
    source: null, // the microphone in Web Audio → gain → the track sent
    gain: null,
    inAnalyser: null,
    inBuf: null,
    sent: null,
    pendingLocal: [],
    pendingRemote: [],
    offerSent: false,
    lastSession: '',
    chain: Promise.resolve(),
    closed: false,
  };
  current = s;
  lastStats = null;
  lastReady = null;
  browserStats = null;
  renderStats();
  setState('starting');
  setStatus('Requesting the microphone…');
  // Created inside the click so that autoplay policies let it run.
  try {
    s.ctx = new AudioContext({ latencyHint: 'interactive' });
    s.ctx.resume().catch(() => {});
  } catch {
    s.ctx = null;
  }
  try {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error('microphone access needs a secure page (HTTPS or localhost)');
    }
    s.stream = await openMic();
    if (s !== current) {
      for (const t of s.stream.getTracks()) t.stop();
      return;
    }
    listDevices(); // labels and ids are there once the microphone is allowed
    applySink();
    s.sent = inputGraph(s);

    const ice = await iceServers();
    if (s !== current) {
      for (const t of s.stream.getTracks()) t.stop();
      return;
    }
    const pc = new RTCPeerConnection({ iceServers: ice, bundlePolicy: 'max-bundle' });
    s.pc = pc;
    s.sender = pc.addTransceiver(s.sent, { direction: 'sendrecv', streams: [new MediaStream([s.sent])] }).sender;
    pc.ontrack = (ev) => onTrack(s, ev);
    pc.onicecandidate = (ev) => {
      const c = ev.candidate ? ev.candidate.toJSON() : null;
      if (!c) return; // end of gathering; the server needs no marker
      if (s.offerSent) send(s, { type: 'candidate', candidate: c });
      else s.pendingLocal.push(c);
    };
    pc.onconnectionstatechange = () => onPeerState(s);

    setState('connecting');
    setStatus('Connecting to the server…');
    const ws = await openSocket(socketURL());
    if (s !== current) {
      ws.close();
      return;
    }
    s.ws = ws;
    ws.onmessage = (ev) => {
      s.chain = s.chain.then(() => onMessage(s, ev.data)).catch((err) => fail(s, err));
    };
    ws.onclose = (ev) => {
      if (s !== current) return;
      if (s.fatal) fail(s, null);
      else fail(s, new Error(`the server closed the connection${ev.reason ? `: ${ev.reason}` : ` (code ${ev.code})`}`));
    };

    sendSession(s);
    const offer = await pc.createOffer();
    const sdp = mungeOpus(offer.sdp, OFFER_OPUS, true);
    try {
      await pc.setLocalDescription({ type: 'offer', sdp });
    } catch (err) {
      console.warn('voxpipe: munged offer refused locally, using the original', err);
      await pc.setLocalDescription(offer);
    }
    if (s !== current) return;
    send(s, { type: 'offer', sdp });
    s.offerSent = true;
    for (const c of s.pendingLocal.splice(0)) send(s, { type: 'candidate', candidate: c });

    s.statsTimer = setInterval(() => pollBrowserStats(s), 1000);
    s.pingTimer = setInterval(() => send(s, { type: 'ping' }), PING_INTERVAL_MS);
    cancelAnimationFrame(meterFrame);
    meterFrame = requestAnimationFrame(drawMeter);
  } catch (err) {
    fail(s, err);
  }
}

async function openMic() {
  try {
    return await navigator.mediaDevices.getUserMedia({ audio: micConstraints(), video: false });
  } catch (err) {
    throw new Error(`microphone unavailable: ${err.message || err.name}`);
  }
}

// inputGraph routes the microphone through Web Audio (source → gain → destination, with an
// analyser for the input meter) and returns the track to send: the gain then works live
// and a new microphone is swapped in without renegotiating. Without Web Audio the
// microphone's own track is sent.
function inputGraph(s) {
  const mic = s.stream.getAudioTracks()[0];
  if (!s.ctx) return mic.clone();
  try {
    s.source = s.ctx.createMediaStreamSource(s.stream);
    s.gain = s.ctx.createGain();
    s.gain.gain.value = dbToGain(ui.gain.value);
    s.inAnalyser = s.ctx.createAnalyser();
    s.inAnalyser.fftSize = 2048;
    s.inBuf = new Float32Array(s.inAnalyser.fftSize);
    const dest = s.ctx.createMediaStreamDestination();
    dest.channelCount = 1;
    s.source.connect(s.gain).connect(dest);
    s.gain.connect(s.inAnalyser);
    return dest.stream.getAudioTracks()[0];
  } catch (err) {
    console.warn('voxpipe: Web Audio input unavailable, sending the microphone as is', err);
    return mic.clone();
  }
}

export function dbToGain(db) {
  return 10 ** (Number(db) / 20);
}

function gainChanged() {
  ui.gainOut.textContent = `${Number(ui.gain.value) > 0 ? '+' : ''}${Number(ui.gain.value)} dB`.replace('-', '−');
  const s = current;
  if (s && s.gain) s.gain.gain.setTargetAtTime(dbToGain(ui.gain.value), s.ctx.currentTime, 0.015);
}

// processingChanged applies the echo/noise/gain choices to the live microphone; what the
// browser cannot change live applies at the next Start.
async function processingChanged() {
  const s = current;
  if (!s || !s.stream) return;
  const track = s.stream.getAudioTracks()[0];
  const want = processing();
  try {
    await track.applyConstraints(want);
  } catch {}
  const got = track.getSettings();
  const pending = ['echoCancellation', 'noiseSuppression', 'autoGainControl'].some(
    (k) => got[k] !== undefined && got[k] !== want[k],
  );
  if (pending) setStatus('The microphone processing change applies after Stop and Start.');
}

// micChanged swaps the chosen microphone into a running session: only the Web Audio source
// changes, the track sent stays (or, without Web Audio, the sender's track is replaced).
async function micChanged() {
  store.set('mic', ui.mic.value);
  const s = current;
  if (!s || !s.stream || !s.pc) return;
  let next;
  try {
    next = await openMic();
  } catch (err) {
    setStatus(err.message, 'error');
    return;
  }
  if (s !== current) {
    for (const t of next.getTracks()) t.stop();
    return;
  }
  const old = s.stream;
  s.stream = next;
  if (s.source) {
    s.source.disconnect();
    s.source = s.ctx.createMediaStreamSource(next);
    s.source.connect(s.gain);
  } else {
    if (s.sent) s.sent.stop();
    s.sent = next.getAudioTracks()[0].clone();
    await s.sender.replaceTrack(s.sent);
  }
  for (const t of old.getTracks()) t.stop();
}

// ---------------------------------------------------------------------------------------
// Wiring

for (const v of query.getAll('voices').flatMap((x) => x.split(','))) ensureVoiceOption(v.trim());
if (query.get('voice')) {
  ensureVoiceOption(query.get('voice'));
  ui.voice.value = query.get('voice');
}

// ---------------------------------------------------------------------------------------
// Voice library: target voices for the voices that need one (needsRef)

function setRefMsg(text, kind = 'info') {
  ui.refMsg.textContent = text;
  ui.refMsg.dataset.kind = kind;
}

// fillRefs lists the library's clips in the target-voice picker, keeping the selection
// (or selecting `select`).
function fillRefs(voices, select = ui.ref.value) {
  const keep = [...ui.ref.options].filter((o) => o.value === '');
  ui.ref.replaceChildren(...keep);
  for (const v of voices || []) {
    if (!v || !v.id) continue;
    const opt = document.createElement('option');
    opt.value = v.id;
    opt.textContent = Number.isFinite(v.seconds) ? `${v.name} (${v.seconds.toFixed(1)} s)` : v.name || v.id;
    ui.ref.append(opt);
  }
  if ([...ui.ref.options].some((o) => o.value === select)) ui.ref.value = select;
}

// The server lists the voices it has loaded and its library; the page works without them.
let voicesLoaded = false;
async function loadVoices(select) {
  try {
    const r = await fetch(withToken('/v1/voices'));
    const list = r.ok ? await r.json() : null;
    const wanted = query.get('voice');
    for (const v of list?.live_voices ?? []) {
      if (!v || !v.name) continue;
      liveVoices.set(v.name, v);
      ensureVoiceOption(v.name, voiceText(v));
    }
    for (const v of list?.processors ?? []) ensureVoiceOption(v);
    if (wanted && [...ui.voice.options].some((o) => o.value === wanted)) ui.voice.value = wanted;
    fillRefs(list?.voices, select ?? (pendingRef || undefined));
  } catch {
    // keep what the page has
  }
  voicesLoaded = true;
  updateOutputs();
}
loadVoices();

// apiError turns an error response of the HTTP API into its message.
async function apiError(res) {
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch {}
  return `${res.status} ${res.statusText}`.trim();
}

async function uploadRef() {
  const file = ui.refFile.files && ui.refFile.files[0];
  if (!file) {
    setRefMsg('Choose a clip first (WAV, FLAC, Ogg or MP3).', 'error');
    return;
  }
  const name = ui.refName.value.trim() || file.name.replace(/\.[^.]*$/, '');
  const form = new FormData();
  form.append('name', name);
  form.append('file', file, file.name);
  ui.refUpload.disabled = true;
  setRefMsg(`Uploading ${file.name}…`);
  try {
    const res = await fetch(withToken('/v1/voices'), { method: 'POST', body: form });
    if (!res.ok) {
      setRefMsg(`Upload failed: ${await apiError(res)}`, 'error');
      return;
    }
    const v = await res.json();
    await loadVoices(v.id);
    ui.refFile.value = '';
    ui.refName.value = '';
    setRefMsg(`Added “${v.name}” (${Number(v.seconds).toFixed(1)} s).`, 'ok');
    controlsChanged();
  } catch (err) {
    setRefMsg(`Upload failed: ${err.message || err}`, 'error');
  } finally {
    ui.refUpload.disabled = false;
  }
}

// ---------------------------------------------------------------------------------------
// Settings kept in the browser (localStorage, keys "voxpipe.*"); a browser that refuses
// storage just forgets them.

const store = {
  get(key, fallback) {
    try {
      const v = localStorage.getItem(`voxpipe.${key}`);
      return v === null ? fallback : JSON.parse(v);
    } catch {
      return fallback;
    }
  },
  set(key, value) {
    try {
      localStorage.setItem(`voxpipe.${key}`, JSON.stringify(value));
    } catch {}
  },
};

// ---------------------------------------------------------------------------------------
// Channel and OBS URL: the channel is a stable name for whatever session this page runs,
// so the OBS URL (obs.html?channel=NAME) survives Stop/Start and reloads.

// channelError says why a name cannot be a channel ('' when it can); the server checks the
// same (docs/protocol.md).
export function channelError(name) {
  if (!name) return 'Give the channel a name.';
  if (name.length > 64) return 'At most 64 characters.';
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(name)) {
    return "Use letters, digits, '.', '_' and '-', starting with a letter or digit.";
  }
  if (/^[sw][0-9a-f]{32}$/.test(name)) return 'That looks like a session id; choose another name.';
  return '';
}

const WORDS = [
  ['amber', 'brave', 'calm', 'clever', 'gentle', 'happy', 'lucky', 'mellow', 'misty', 'quiet', 'rapid', 'silver', 'sunny', 'swift', 'velvet', 'wild'],
  ['badger', 'comet', 'falcon', 'fox', 'heron', 'koala', 'lynx', 'otter', 'owl', 'panda', 'raven', 'robin', 'tiger', 'walrus', 'wombat', 'zebra'],
];

function randomChannel() {
  const r = crypto.getRandomValues(new Uint32Array(3));
  return `${WORDS[0][r[0] % 16]}-${WORDS[1][r[1] % 16]}-${100 + (r[2] % 900)}`;
}

// The page URL's ?channel= wins, then the one saved, else a new random one (saved).
function initialChannel() {
  const wanted = query.get('channel');
  if (wanted && !channelError(wanted)) return wanted;
  if (wanted) setChannelMsg(`?channel=${wanted}: ${channelError(wanted)}`, 'error');
  const saved = store.get('channel', '');
  return saved && !channelError(saved) ? saved : randomChannel();
}

function setChannelMsg(text, kind = 'info') {
  ui.channelMsg.textContent = text;
  ui.channelMsg.dataset.kind = kind;
}

export function obsURL() {
  const url = `${location.origin}/obs.html?channel=${encodeURIComponent(channel)}`;
  return TOKEN ? `${url}&token=${encodeURIComponent(TOKEN)}` : url;
}

function setChannel(name) {
  channel = name;
  store.set('channel', name);
  ui.obsURL.value = obsURL();
}

// channelInput checks the name as it is typed; channelCommit takes it (a running session
// moves to it at once).
function channelInput() {
  const err = channelError(ui.channel.value.trim());
  ui.channel.setAttribute('aria-invalid', String(Boolean(err)));
  setChannelMsg(err, err ? 'error' : 'info');
}

function channelCommit() {
  const name = ui.channel.value.trim();
  const err = channelError(name);
  if (err) {
    setChannelMsg(`${err} Still using “${channel}”.`, 'error');
    return;
  }
  ui.channel.value = name;
  setChannel(name);
  setChannelMsg('');
  controlsChanged();
}

function setOBSMsg(text, kind = 'info') {
  ui.obsMsg.textContent = text;
  ui.obsMsg.dataset.kind = kind;
}

// copyOBS puts the OBS URL on the clipboard; where the browser refuses (no clipboard API,
// no permission, not a secure page) it selects the URL in its field for Ctrl+C.
async function copyOBS() {
  ui.obsURL.value = obsURL();
  const key = TOKEN ? ' It holds your API key: keep it private.' : '';
  try {
    await navigator.clipboard.writeText(ui.obsURL.value);
    setOBSMsg(`Copied. In OBS add a Browser Source with this URL and tick “Control audio via OBS”.${key}`, 'ok');
  } catch {
    ui.obsURL.focus();
    ui.obsURL.select();
    setOBSMsg(`Press Ctrl+C (⌘C) to copy the selected URL.${key}`);
  }
}

// ---------------------------------------------------------------------------------------
// Devices: the microphone (getUserMedia deviceId) and the output (setSinkId where the
// browser has it), both remembered.

const CAN_PICK_OUTPUT = 'setSinkId' in HTMLMediaElement.prototype;

function fillDevices(select, devices, chosen, noun) {
  const opts = [new Option('System default', '')];
  devices.forEach((d, i) => {
    if (d.deviceId && d.deviceId !== 'default') opts.push(new Option(d.label || `${noun} ${i + 1}`, d.deviceId));
  });
  // A saved device that is not listed (unplugged, or labels not yet allowed) stays chosen.
  if (chosen && !opts.some((o) => o.value === chosen)) opts.push(new Option(`saved ${noun.toLowerCase()}`, chosen));
  select.replaceChildren(...opts);
  select.value = chosen;
}

async function listDevices() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  let devices;
  try {
    devices = await navigator.mediaDevices.enumerateDevices();
  } catch {
    return;
  }
  fillDevices(ui.mic, devices.filter((d) => d.kind === 'audioinput'), store.get('mic', ''), 'Microphone');
  if (CAN_PICK_OUTPUT) {
    fillDevices(ui.speaker, devices.filter((d) => d.kind === 'audiooutput'), store.get('speaker', ''), 'Output');
  }
}

async function applySink() {
  if (!CAN_PICK_OUTPUT) return;
  try {
    await ui.remote.setSinkId(ui.speaker.value);
    ui.speakerNote.hidden = true;
  } catch (err) {
    ui.speakerNote.hidden = false;
    ui.speakerNote.textContent = `Cannot play on that output (${err.name || err.message}); using the default.`;
  }
}

function speakerChanged() {
  store.set('speaker', ui.speaker.value);
  applySink();
}

// ---------------------------------------------------------------------------------------
// Presets: named sets of the voice and microphone controls, kept in this browser.

function presets() {
  const p = store.get('presets', {});
  return p && typeof p === 'object' ? p : {};
}

function currentPreset() {
  return {
    voice: ui.voice.value,
    pitch: Number(ui.pitch.value),
    formant: Number(ui.formant.value),
    ref: ui.ref.value,
    gain: Number(ui.gain.value),
    echo: ui.echo.checked,
    noise: ui.noise.checked,
    agc: ui.agc.checked,
  };
}

let pendingRef = ''; // a preset's ref not yet listed (the library loads after the page)

function applyPreset(p) {
  if (typeof p.voice === 'string' && p.voice) {
    ensureVoiceOption(p.voice);
    ui.voice.value = p.voice;
  }
  if (Number.isFinite(p.pitch)) ui.pitch.value = String(p.pitch);
  if (Number.isFinite(p.formant)) ui.formant.value = String(p.formant);
  if (typeof p.ref === 'string') {
    pendingRef = p.ref;
    if ([...ui.ref.options].some((o) => o.value === p.ref)) ui.ref.value = p.ref;
  }
  if (Number.isFinite(p.gain)) ui.gain.value = String(p.gain);
  for (const k of ['echo', 'noise', 'agc']) if (typeof p[k] === 'boolean') ui[k].checked = p[k];
  gainChanged();
  processingChanged();
  controlsChanged();
}

function fillPresets(select = ui.preset.value) {
  const names = Object.keys(presets()).sort((a, b) => a.localeCompare(b));
  ui.preset.replaceChildren(new Option('— no preset —', ''), ...names.map((n) => new Option(n, n)));
  ui.preset.value = names.includes(select) ? select : '';
}

function setPresetMsg(text, kind = 'info') {
  ui.presetMsg.textContent = text;
  ui.presetMsg.dataset.kind = kind;
}

function savePreset() {
  const name = ui.presetName.value.trim() || ui.preset.value;
  if (!name) {
    setPresetMsg('Name the preset first.', 'error');
    return;
  }
  store.set('presets', { ...presets(), [name]: currentPreset() });
  store.set('preset', name);
  fillPresets(name);
  ui.presetName.value = '';
  setPresetMsg(`Saved “${name}”.`, 'ok');
}

function loadPreset() {
  const name = ui.preset.value;
  const p = presets()[name];
  if (!p) {
    setPresetMsg('Choose a preset to load.', 'error');
    return;
  }
  applyPreset(p);
  store.set('preset', name);
  setPresetMsg(`Loaded “${name}”.`, 'ok');
}

function deletePreset() {
  const name = ui.preset.value;
  if (!name) {
    setPresetMsg('Choose a preset to delete.', 'error');
    return;
  }
  const all = presets();
  delete all[name];
  store.set('presets', all);
  if (store.get('preset', '') === name) store.set('preset', '');
  fillPresets('');
  setPresetMsg(`Deleted “${name}”.`);
}

// ---------------------------------------------------------------------------------------
// Events and start-up

ui.start.addEventListener('click', () => (current ? stop() : start()));
for (const box of [ui.echo, ui.noise, ui.agc]) box.addEventListener('change', processingChanged);
ui.gain.addEventListener('input', gainChanged);
ui.mic.addEventListener('change', micChanged);
ui.speaker.addEventListener('change', speakerChanged);
ui.channel.addEventListener('input', channelInput);
ui.channel.addEventListener('change', channelCommit);
ui.copyOBS.addEventListener('click', copyOBS);
ui.obsURL.addEventListener('focus', () => ui.obsURL.select());
ui.presetSave.addEventListener('click', savePreset);
ui.presetLoad.addEventListener('click', loadPreset);
ui.presetDelete.addEventListener('click', deletePreset);
ui.preset.addEventListener('change', () => {
  ui.presetName.value = ui.preset.value;
});
ui.refUpload.addEventListener('click', uploadRef);
for (const input of [ui.voice, ui.pitch, ui.formant, ui.passthrough, ui.ref]) {
  input.addEventListener('input', controlsChanged);
  input.addEventListener('change', controlsChanged);
}
ui.reset.addEventListener('click', () => {
  ui.pitch.value = '0';
  ui.formant.value = '0';
  ui.passthrough.checked = false;
  controlsChanged();
});
window.addEventListener('pagehide', () => stop());

setChannel(initialChannel());
ui.channel.value = channel;
if (!CAN_PICK_OUTPUT) {
  ui.speaker.disabled = true;
  ui.speakerNote.hidden = false;
  ui.speakerNote.textContent = 'This browser cannot choose the output device: audio plays on the system default.';
}
listDevices();
if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
  navigator.mediaDevices.addEventListener('devicechange', listDevices);
}
fillPresets();
// The preset last saved or loaded comes back after a reload (the URL's ?voice= still wins).
const lastPreset = presets()[store.get('preset', '')];
if (lastPreset) {
  applyPreset(lastPreset);
  ui.preset.value = store.get('preset', '');
  if (query.get('voice')) ui.voice.value = query.get('voice');
}
gainChanged();
updateOutputs();
setState('idle');

window.voxpipe = {
  get state() {
    return state;
  },
  get lastStats() {
    return lastStats;
  },
  get lastReady() {
    return lastReady;
  },
  get browserStats() {
    return browserStats;
  },
  get pc() {
    return current ? current.pc : null;
  },
  get voicesLoaded() {
    return voicesLoaded;
  },
  get liveVoices() {
    return Object.fromEntries(liveVoices);
  },
  get channel() {
    return channel;
  },
  obsURL,
  outputLevel,
  inputLevel,
  start,
  stop,
};
