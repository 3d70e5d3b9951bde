// A project page's A/B player and its reference track's form.
//
// The two sources (exports the archive holds, or the project's reference track)
// are decoded whole and started together on one Web Audio clock, so that
// switching changes only which of the two is heard: the same place, at once.
// Loudness-matched by default: the louder is turned down by the difference of
// their measured integrated loudness (the reviews' own figures). Everything it
// plays comes from agentbox's own server; nothing from elsewhere.
//
// What it does is on the panel for people and programs alike: data-state
// (loading, ready, playing, paused), data-active (a or b), data-position
// (seconds, as the clock shows it) and, on #ab-gain, the gain applied to each
// side in dB (data-gain-a-db, data-gain-b-db), read back from the audio graph.
//
// Two files of different lengths (a reference shorter than the mix, say) play from
// the same place until the longer ends. The clock counts the file heard, up to its
// own length (a shorter one heard past its end reads its end, and the page says it
// has ended); a loop, which both must play, ends by the shorter one's end, and the
// page says so (#ab-lengths).
(() => {
  "use strict";
  const SWITCH_SECONDS = 0.004;  // the crossfade that keeps a switch from clicking
  const START_AHEAD = 0.03;      // both sources start together this far ahead

  // -- the reference track's form (works without the player) -----------------------
  const form = document.getElementById("reference-form");
  if (form) {
    const said = document.getElementById("reference-status");
    const send = (method, body, name) => {
      const url = form.dataset.url + (name ? "?name=" + encodeURIComponent(name) : "");
      const headers = {"X-CSRF-Token": form.dataset.csrf};
      if (body) headers["Content-Type"] = body.type || "application/octet-stream";
      return fetch(url, {method, body, headers}).then((r) => r.ok ? r : r.json().then(
        (e) => { throw new Error(e.message || r.statusText); },
        () => { throw new Error(r.status + " " + r.statusText); }));
    };
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const file = document.getElementById("reference-file").files[0];
      if (!file) { said.textContent = "Choose an audio file first."; return; }
      said.textContent = "Sending and measuring " + file.name + "…";
      send("PUT", file, file.name).then(() => location.reload())
        .catch((err) => { said.textContent = err.message; });
    });
    const remove = document.getElementById("reference-remove");
    if (remove) remove.addEventListener("click", () => {
      send("DELETE").then(() => location.reload())
        .catch((err) => { said.textContent = err.message; });
    });
  }

  const panel = document.getElementById("ab");
  if (!panel) return;
  const $ = (id) => document.getElementById("ab-" + id);
  const pick = {a: $("a"), b: $("b")};
  const ui = {play: $("play"), swap: $("switch"), hearing: $("hearing"), clock: $("clock"),
              seek: $("seek"), matched: $("matched"), gain: $("gain"), loop: $("loop"),
              loopStart: $("loop-start"), loopEnd: $("loop-end"), status: $("status"),
              lengths: $("lengths")};
  let ctx = null;          // the AudioContext, made when first needed
  const decoded = new Map();  // url -> Promise of an AudioBuffer
  let buffers = null;      // {a, b}: the chosen pair, once both are decoded
  let nodes = null;        // per side: level (matching) and heard (switching) gains
  let playing = null;      // {sources, startedAt, offset}: what plays, since when
  let paused = 0;          // the position while not playing (seconds)
  let active = "a";
  let wantsToPlay = false; // Play was pressed before the pair was loaded
  let chosen = 0;          // which choice of the pair is current (a later one wins)
  let loopEndGiven = false; // the loop's end was typed or marked (else: the shorter's end)

  const mmss = (s) => {
    const m = Math.floor(s / 60);
    const rest = s - 60 * m;
    return m + ":" + (rest < 10 ? "0" : "") + rest.toFixed(1);
  };
  const seconds = (text) => {  // "1:23.4", "83.4" -> 83.4; NaN when not a time
    const parts = String(text).trim().split(":").map(Number);
    return parts.length === 2 ? parts[0] * 60 + parts[1] : parts.length === 1 ? parts[0] : NaN;
  };
  const option = (side) => pick[side].selectedOptions[0];
  const duration = () => buffers ? Math.max(buffers.a.duration, buffers.b.duration) : 0;
  const shortest = () => buffers ? Math.min(buffers.a.duration, buffers.b.duration) : 0;
  const lengthOf = (side) => buffers ? buffers[side].duration : 0;
  const say = (text) => { ui.status.textContent = text; };

  // The context runs at the rate of the first pair loaded (the reviews say it), so
  // that nothing is resampled as it is decoded.
  function context(rate) {
    if (!ctx) {
      ctx = rate ? new AudioContext({sampleRate: rate}) : new AudioContext();
      nodes = {};
      for (const side of ["a", "b"]) {
        const level = ctx.createGain();
        const heard = ctx.createGain();
        heard.gain.value = side === active ? 1 : 0;
        level.connect(heard).connect(ctx.destination);
        nodes[side] = {level, heard};
      }
    }
    return ctx;
  }

  // -- loading: the whole file, decoded --------------------------------------------------
  function load(url, side) {
    if (!decoded.has(url)) {
      decoded.set(url, fetchAll(url, side).then((bytes) => decode(bytes)));
      decoded.get(url).catch(() => decoded.delete(url));  // a later choice tries again
    }
    return decoded.get(url);
  }

  async function fetchAll(url, side) {
    const response = await fetch(url);
    if (!response.ok) {
      const said = await response.json().catch(() => ({}));
      throw new Error(side.toUpperCase() + ": " + (said.message || response.statusText));
    }
    return response.arrayBuffer();
  }

  // WAV and AIFF (PCM) are read here: three times faster than the browser's decoder,
  // which Chromium cannot use for AIFF at all; anything else (FLAC, MP3, Ogg) the
  // browser decodes.
  function decode(bytes) {
    const found = wav(bytes) || aiff(bytes);
    return found ? pcm(bytes, found) : context(rateOf("a")).decodeAudioData(bytes);
  }

  const tag = (bytes, at) => String.fromCharCode(...new Uint8Array(bytes, at, 4));

  function wav(bytes) {  // RIFF WAVE: integer PCM (1), float (3), or either extensible
    if (bytes.byteLength < 12 || tag(bytes, 0) !== "RIFF" || tag(bytes, 8) !== "WAVE") return null;
    const view = new DataView(bytes);
    let format = null;
    for (let at = 12; at + 8 <= bytes.byteLength;) {
      const id = tag(bytes, at), size = view.getUint32(at + 4, true);
      if (id === "fmt ") {
        let code = view.getUint16(at + 8, true);
        if (code === 0xfffe && size >= 26) code = view.getUint16(at + 32, true);
        format = {channels: view.getUint16(at + 10, true), rate: view.getUint32(at + 12, true),
                  bits: view.getUint16(at + 22, true), float: code === 3, little: true,
                  ok: code === 1 || code === 3};
      } else if (id === "data" && format && format.ok) {
        return {...format, data: at + 8, size: Math.min(size, bytes.byteLength - at - 8)};
      }
      at += 8 + size + (size % 2);
    }
    return null;
  }

  function aiff(bytes) {  // AIFF, or AIFF-C uncompressed ('NONE', 'sowt', 'fl32')
    if (bytes.byteLength < 12 || tag(bytes, 0) !== "FORM" || !/AIF[FC]/.test(tag(bytes, 8))) {
      return null;
    }
    const view = new DataView(bytes);
    let format = null;
    for (let at = 12; at + 8 <= bytes.byteLength;) {
      const id = tag(bytes, at), size = view.getUint32(at + 4);
      if (id === "COMM") {
        const kind = size >= 22 ? tag(bytes, at + 26) : "NONE";
        format = {channels: view.getInt16(at + 8), bits: view.getInt16(at + 14),
                  rate: extended(view, at + 16), little: kind === "sowt",
                  float: kind === "fl32" || kind === "FL32",
                  ok: ["NONE", "twos", "sowt", "fl32", "FL32"].includes(kind)};
      } else if (id === "SSND" && format && format.ok) {
        const data = at + 16 + view.getUint32(at + 8);
        return {...format, data, size: Math.min(size - 8, bytes.byteLength - data)};
      }
      at += 8 + size + (size % 2);
    }
    return null;
  }

  function extended(view, at) {  // an 80-bit IEEE 754 extended number (the sample rate)
    const exponent = (view.getUint16(at) & 0x7fff) - 16383;
    const mantissa = view.getUint32(at + 2) * 2 ** -31 + view.getUint32(at + 6) * 2 ** -63;
    return Math.round(mantissa * 2 ** exponent);
  }

  // Samples to floats, a slice of frames at a time (the page stays responsive).
  async function pcm(bytes, f) {
    const width = f.bits / 8, step = width * f.channels;
    if (![1, 2, 3, 4].includes(width) || (f.float && width !== 4) || !f.channels || !f.rate) {
      return context(rateOf("a")).decodeAudioData(bytes);
    }
    const frames = Math.floor(f.size / step);
    const out = new AudioBuffer({numberOfChannels: f.channels, length: Math.max(frames, 1),
                                 sampleRate: f.rate});
    const u = new Uint8Array(bytes, f.data, frames * step);
    const view = new DataView(bytes, f.data, frames * step);
    const read = reader(width, f.little, f.float, view);
    for (let start = 0; start < frames; start += 1 << 18) {
      const end = Math.min(frames, start + (1 << 18));
      for (let c = 0; c < f.channels; c++) {
        const lane = out.getChannelData(c);
        for (let i = start, at = start * step + c * width; i < end; i++, at += step) {
          lane[i] = read(u, at);
        }
      }
      await new Promise((next) => setTimeout(next));
    }
    return out;
  }

  function reader(width, little, float, view) {
    if (float) return (u, at) => view.getFloat32(at, little);
    if (width === 1) return little ? (u, at) => (u[at] - 128) / 128 : (u, at) => (u[at] << 24 >> 24) / 128;
    if (width === 2) {
      return little ? (u, at) => ((u[at] | u[at + 1] << 8) << 16 >> 16) / 32768
        : (u, at) => ((u[at + 1] | u[at] << 8) << 16 >> 16) / 32768;
    }
    if (width === 3) {
      return little ? (u, at) => ((u[at] | u[at + 1] << 8 | u[at + 2] << 16) << 8 >> 8) / 8388608
        : (u, at) => ((u[at + 2] | u[at + 1] << 8 | u[at] << 16) << 8 >> 8) / 8388608;
    }
    return little ? (u, at) => (u[at] | u[at + 1] << 8 | u[at + 2] << 16 | u[at + 3] << 24) / 2147483648
      : (u, at) => (u[at + 3] | u[at + 2] << 8 | u[at + 1] << 16 | u[at] << 24) / 2147483648;
  }

  const rateOf = (side) => Number(option(side).dataset.rate) || undefined;

  function choose() {
    const mine = ++chosen;
    const was = playing !== null;
    stop();
    buffers = null;
    panel.dataset.state = "loading";
    ui.play.disabled = false;
    say("Loading " + option("a").text + " and " + option("b").text + "…");
    Promise.all(["a", "b"].map((side) => load(option(side).dataset.src, side)))
      .then(([a, b]) => {
        if (mine !== chosen) return;
        buffers = {a, b};
        ui.seek.max = duration().toFixed(1);
        ui.seek.disabled = ui.swap.disabled = false;
        lengths();
        paused = Math.min(paused, duration());
        panel.dataset.state = "ready";
        levels();
        say("Ready: Space plays and pauses, S switches between A and B at the same place.");
        if (wantsToPlay || was) play();
        show();
      })
      .catch((err) => {
        if (mine !== chosen) return;
        panel.dataset.state = "failed";
        wantsToPlay = false;
        say(err.message);
      });
  }

  // -- lengths: the loop within both, said when they differ ---------------------------
  function lengths() {
    const end = seconds(ui.loopEnd.value);
    if (!loopEndGiven || !(end > 0)) ui.loopEnd.value = mmss(shortest());
    else if (end > shortest()) clampLoopEnd();
    const [a, b] = [lengthOf("a"), lengthOf("b")];
    if (Math.abs(a - b) < 0.05) { ui.lengths.textContent = ""; return; }
    const short = a < b ? "A" : "B";
    ui.lengths.textContent = "A is " + mmss(a) + " long, B " + mmss(b) + ": the clock " +
      "counts the one you hear, and a loop ends by " + mmss(shortest()) + ", where " +
      short + " ends (both play in a loop).";
  }

  function clampLoopEnd() {  // a loop's end past the shorter file's: its end instead
    const end = seconds(ui.loopEnd.value);
    if (!buffers || !(end > shortest())) return;
    ui.loopEnd.value = mmss(shortest());
    say("The loop ends at " + mmss(shortest()) + ", where the shorter of the two ends.");
  }

  // -- levels: the louder turned down to the quieter's loudness ----------------------
  function levels() {
    context(buffers.a.sampleRate);
    const la = Number(option("a").dataset.lufs), lb = Number(option("b").dataset.lufs);
    const known = "lufs" in option("a").dataset && "lufs" in option("b").dataset;
    const match = ui.matched.checked && known;
    const db = {a: match ? Math.min(0, lb - la) : 0, b: match ? Math.min(0, la - lb) : 0};
    for (const side of ["a", "b"]) nodes[side].level.gain.value = 10 ** (db[side] / 20);
    // What the graph applies, read back: what the page says and the tests check.
    const applied = (side) => 20 * Math.log10(nodes[side].level.gain.value);
    ui.gain.dataset.gainADb = applied("a").toFixed(2);
    ui.gain.dataset.gainBDb = applied("b").toFixed(2);
    const down = applied("a") < -0.05 ? "a" : applied("b") < -0.05 ? "b" : null;
    if (!known) {
      ui.gain.textContent = "Levels as they are: the loudness of one of them is not known.";
    } else if (!ui.matched.checked) {
      const louder = la > lb ? "A" : "B";
      ui.gain.textContent = Math.abs(la - lb) < 0.05 ? "Real levels: equally loud."
        : "Real levels: " + louder + " is " + Math.abs(la - lb).toFixed(1) + " dB louder.";
    } else {
      ui.gain.textContent = down === null ? "Equally loud: nothing turned down."
        : down.toUpperCase() + " turned down " + (-applied(down)).toFixed(1) + " dB to match";
    }
  }

  // -- playing: both sources at once, from the same place ----------------------------
  function loopRange() {
    if (!ui.loop.checked || !buffers) return null;
    const start = Math.max(0, seconds(ui.loopStart.value) || 0);
    const end = Math.min(shortest(), seconds(ui.loopEnd.value) || shortest());
    return end - start > 0.05 ? {start, end} : null;
  }

  function position() {
    if (!playing) return paused;
    const elapsed = ctx.currentTime - playing.startedAt;
    let at = playing.offset + Math.max(0, elapsed);
    const loop = playing.loop;
    if (loop && at >= loop.end) at = loop.start + (at - loop.start) % (loop.end - loop.start);
    return at;
  }

  async function play() {
    wantsToPlay = true;
    if (!buffers) { say("Loading… it plays as soon as both are here."); return; }
    wantsToPlay = false;
    await context(buffers.a.sampleRate).resume();
    if (playing) return;
    start(paused >= duration() - 0.05 ? 0 : paused);
  }

  function start(from) {
    const loop = loopRange();
    if (loop && (from < loop.start || from >= loop.end)) from = loop.start;
    const at = ctx.currentTime + START_AHEAD;
    const sources = ["a", "b"].map((side) => {
      const source = ctx.createBufferSource();
      source.buffer = buffers[side];
      if (loop) { source.loop = true; source.loopStart = loop.start; source.loopEnd = loop.end; }
      source.connect(nodes[side].level);
      if (from < source.buffer.duration) source.start(at, from);
      return source;
    });
    playing = {sources, startedAt: at, offset: from, loop};
    panel.dataset.state = "playing";
    panel.dataset.startedAt = at.toFixed(3);
    ui.play.textContent = "Pause";
    requestAnimationFrame(tick);
  }

  function stop() {
    if (!playing) return;
    paused = position();
    for (const source of playing.sources) {
      try { source.stop(); } catch (err) { /* never started: past its end */ }
      source.disconnect();
    }
    playing = null;
  }

  function pause() {
    wantsToPlay = false;
    stop();
    if (buffers) panel.dataset.state = "paused";
    ui.play.textContent = "Play";
    show();
  }

  function restart(from) {  // a new place or a new loop: both sources start again together
    if (playing) { stop(); start(from); } else { paused = from; show(); }
  }

  function switchTo(side) {
    active = side;
    if (nodes) {
      const now = ctx.currentTime;
      for (const s of ["a", "b"]) {
        nodes[s].heard.gain.cancelScheduledValues(now);
        nodes[s].heard.gain.setTargetAtTime(s === side ? 1 : 0, now, SWITCH_SECONDS);
      }
    }
    panel.dataset.active = side;
    show();
  }

  function show() {
    const at = position();
    panel.dataset.position = at.toFixed(3);
    const heard = lengthOf(active);  // the clock counts the file heard, to its end
    ui.clock.textContent = mmss(Math.min(at, heard)) + " / " + mmss(heard);
    const ended = buffers && at >= heard && heard < duration();
    if (ended !== panel.hasAttribute("data-heard-ended")) {
      panel.toggleAttribute("data-heard-ended", ended);
      if (ended) {
        say(active.toUpperCase() + " ended at " + mmss(heard) + "; " +
            (active === "a" ? "B" : "A") + " plays on to " + mmss(duration()) +
            ": switch to hear it.");
      }
    }
    if (document.activeElement !== ui.seek) ui.seek.value = at.toFixed(1);
    ui.hearing.textContent = "Hearing " + active.toUpperCase();
    ui.swap.firstChild.textContent = "Switch to " + (active === "a" ? "B" : "A") + " ";
    for (const label of panel.querySelectorAll(".ab-side")) {
      label.classList.toggle("heard", label.dataset.side === active);
    }
  }

  function tick() {
    if (!playing) return;
    if (!playing.loop && position() >= duration()) {
      stop();
      paused = 0;
      pause();
      return;
    }
    show();
    requestAnimationFrame(tick);
  }

  // -- what people do ------------------------------------------------------------------
  ui.play.addEventListener("click", () => (playing ? pause() : play()));
  ui.swap.addEventListener("click", () => switchTo(active === "a" ? "b" : "a"));
  ui.matched.addEventListener("change", () => { if (buffers) levels(); });
  pick.a.addEventListener("change", choose);
  pick.b.addEventListener("change", choose);
  ui.seek.addEventListener("change", () => restart(Number(ui.seek.value)));
  ui.loop.addEventListener("change", () => restart(position()));
  for (const input of [ui.loopStart, ui.loopEnd]) {
    input.addEventListener("change", () => {
      if (input === ui.loopEnd) { loopEndGiven = ui.loopEnd.value.trim() !== ""; clampLoopEnd(); }
      if (ui.loop.checked) restart(position());
    });
  }
  $("mark-start").addEventListener("click", () => { ui.loopStart.value = mmss(position()); });
  $("mark-end").addEventListener("click", () => {
    ui.loopEnd.value = mmss(position());
    loopEndGiven = true;
    clampLoopEnd();
  });
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || e.target.closest("input, select, textarea")) return;
    if (e.key === "s" || e.key === "S") {
      e.preventDefault();
      switchTo(active === "a" ? "b" : "a");
    } else if (e.key === " " && !e.target.closest("button")) {
      e.preventDefault();
      if (playing) pause(); else play();
    }
  });

  // The pair is loaded when the player comes into view, so that Play starts at once.
  const seen = new IntersectionObserver((entries) => {
    if (entries.some((entry) => entry.isIntersecting)) { seen.disconnect(); choose(); }
  });
  seen.observe(panel);
  show();
})();
