// OBS Browser Source page: plays one live session's output, pulled with WHEP from
// /v1/whep/{session} (docs/protocol.md). URL: /obs.html?session=ID[&token=KEY][&quiet=1].
// In OBS, tick "Control audio via OBS" so the audio goes through the mixer.

const params = new URLSearchParams(location.search);
const session = params.get('session');
const token = params.get('token');
const status = document.getElementById('status');
const out = document.getElementById('out');
if (params.has('quiet')) document.body.classList.add('quiet');

let analyser = null;
window.voxpipeOBS = {
  state: 'connecting',
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

function gathered(pc) {
  if (pc.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === 'complete') resolve(); };
    pc.addEventListener('icegatheringstatechange', done);
    setTimeout(resolve, 3000); // use what was gathered so far
  });
}

async function connect() {
  if (!session) {
    show('error', 'add ?session=ID (the session id of the voice changer or a WHIP sender)');
    return;
  }
  let iceServers = []; // the server's STUN/TURN servers (serve --ice-server)
  try {
    const r = await fetch(`/v1/rtc/config${token ? `?token=${encodeURIComponent(token)}` : ''}`);
    if (r.ok) iceServers = (await r.json()).ice_servers || [];
  } catch {
    // none
  }
  const pc = new RTCPeerConnection({ iceServers });
  pc.addTransceiver('audio', { direction: 'recvonly' });
  pc.ontrack = (ev) => {
    const stream = ev.streams[0] || new MediaStream([ev.track]);
    out.srcObject = stream;
    const ctx = new AudioContext();
    analyser = ctx.createAnalyser();
    ctx.createMediaStreamSource(stream).connect(analyser);
    out.play().catch(() => {});
  };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === 'connected') show('playing', `playing session ${session}`);
    if (pc.connectionState === 'failed' || pc.connectionState === 'closed') retry(pc, 'connection lost');
  };
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const url = `/v1/whep/${encodeURIComponent(session)}${token ? `?token=${encodeURIComponent(token)}` : ''}`;
    const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/sdp' }, body: pc.localDescription.sdp });
    if (res.status !== 201) throw new Error(`${res.status} ${(await res.text()).trim()}`);
    await pc.setRemoteDescription({ type: 'answer', sdp: await res.text() });
  } catch (err) {
    retry(pc, err.message);
  }
}

function retry(pc, why) {
  pc.close();
  show('waiting', `waiting for session ${session}: ${why}`);
  setTimeout(connect, 2000); // the session may not have started yet
}

connect();
