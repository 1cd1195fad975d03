// OBS Browser Source page: plays a live session's output, pulled with WHEP (docs/protocol.md).
// URL: /obs.html?channel=NAME (whatever session is live on the voice changer's channel; it
// follows the channel across restarts) or ?session=ID (one session), [&token=KEY][&quiet=1].
// In OBS, tick "Control audio via OBS" so the audio goes through the mixer.

const params = new URLSearchParams(location.search);
const channel = params.get('channel');
const session = params.get('session');
const token = params.get('token');
const status = document.getElementById('status');
const out = document.getElementById('out');
if (params.has('quiet')) document.body.classList.add('quiet');

const RETRY_MS = 2000; // how often an idle channel (or a missing session) is asked again
const STALL_MS = 3000; // the server sends a packet every 20 ms: this long without one, it is gone

let pc = null; // the current connection; a callback of an older one does nothing
let ctx = null;
let analyser = null;
let viewer = null; // the WHEP resource to DELETE when leaving
window.voxpipeOBS = {
  state: 'connecting',
  session: null, // the session playing now
  level() {
    if (!analyser) return 0;
    const buf = new Float32Array(analyser.fftSize);
    analyser.getFloatTimeDomainData(buf);
    let s = 0;
    for (const v of buf) s += v * v;
    return Math.sqrt(s / buf.length);
  },
};

function show(state, text) {
  window.voxpipeOBS.state = state;
  status.textContent = text;
}

function withToken(url) {
  return token ? `${url}?token=${encodeURIComponent(token)}` : url;
}

function gathered(conn) {
  if (conn.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    conn.addEventListener('icegatheringstatechange', () => {
      if (conn.iceGatheringState === 'complete') resolve();
    });
    setTimeout(resolve, 3000); // use what was gathered so far
  });
}

async function iceServers() {
  try {
    const r = await fetch(withToken('/v1/rtc/config'));
    if (r.ok) return (await r.json()).ice_servers || []; // the server's STUN/TURN (serve --ice-server)
  } catch {
    // none
  }
  return [];
}

function playing() {
  const id = window.voxpipeOBS.session;
  show('playing', channel ? `playing channel ${channel}` : `playing session ${id}`);
  status.title = id || '';
}

// watch ends the connection when its packets stop: a session that ended may leave the
// connection "connected" for a while, and a channel's next session must not wait for that.
function watch(conn) {
  let last = -1;
  let since = performance.now();
  const timer = setInterval(async () => {
    if (conn !== pc) {
      clearInterval(timer);
      return;
    }
    let got = 0;
    try {
      (await conn.getStats()).forEach((r) => {
        if (r.type === 'inbound-rtp' && r.kind === 'audio') got = r.packetsReceived || 0;
      });
    } catch {
      return;
    }
    if (got !== last) {
      last = got;
      since = performance.now();
    } else if (window.voxpipeOBS.state === 'playing' && performance.now() - since > STALL_MS) {
      retry(conn, 'the session ended', true);
    }
  }, 500);
}

async function connect() {
  if (!channel && !session) {
    show('error', 'add ?channel=NAME (the voice changer page\'s channel) or ?session=ID');
    return;
  }
  const conn = new RTCPeerConnection({ iceServers: await iceServers() });
  pc = conn;
  conn.addTransceiver('audio', { direction: 'recvonly' });
  conn.ontrack = (ev) => {
    if (conn !== pc) return;
    const stream = ev.streams[0] || new MediaStream([ev.track]);
    out.srcObject = stream;
    ctx = new AudioContext();
    analyser = ctx.createAnalyser();
    ctx.createMediaStreamSource(stream).connect(analyser);
    out.play().catch(() => {});
  };
  conn.onconnectionstatechange = () => {
    const st = conn.connectionState;
    if (st === 'connected' && conn === pc) playing();
    if (st === 'disconnected' || st === 'failed' || st === 'closed') retry(conn, 'the session ended', true);
  };
  try {
    await conn.setLocalDescription(await conn.createOffer());
    await gathered(conn);
    const res = await fetch(withToken(`/v1/whep/${encodeURIComponent(channel || session)}`), {
      method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: conn.localDescription.sdp,
    });
    if (res.status === 404 && channel) {
      retry(conn, 'no live session', true);
      return;
    }
    if (res.status !== 201) throw new Error(`${res.status} ${(await res.text()).trim()}`);
    viewer = res.headers.get('Location');
    // Location: /v1/whep/{session}/{viewer} names the session even when a channel was asked.
    window.voxpipeOBS.session = (viewer || '').split('/')[3] || session;
    await conn.setRemoteDescription({ type: 'answer', sdp: await res.text() });
    watch(conn);
  } catch (err) {
    retry(conn, err.message, false);
  }
}

// retry drops conn (once: several events may report the same end) and asks again soon:
// a channel's next session, or a session that has not started yet.
function retry(conn, why, ended) {
  if (conn !== pc) return;
  pc = null;
  conn.close();
  if (viewer) fetch(withToken(viewer), { method: 'DELETE' }).catch(() => {}); // free the server's side now
  viewer = null;
  if (ctx) ctx.close().catch(() => {});
  ctx = null;
  analyser = null;
  out.srcObject = null;
  window.voxpipeOBS.session = null;
  status.title = '';
  if (channel && ended) show('idle', `channel ${channel}: idle (${why})`);
  else show('waiting', `waiting for ${channel ? `channel ${channel}` : `session ${session}`}: ${why}`);
  setTimeout(connect, RETRY_MS);
}

connect();
