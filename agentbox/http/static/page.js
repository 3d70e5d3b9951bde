// agentbox's page: local times, and live updates from /ui/stream (Server-Sent
// Events). A file of its own, not inline, so that the page runs under a
// Content-Security-Policy without 'unsafe-inline'.
(function () {
  "use strict";
  const TERMINAL = new Set(["succeeded", "failed_permanent", "dead_lettered"]);

  // Times come as UTC (ISO 8601) from the server; show them in this browser's zone.
  function localTimes(root) {
    root.querySelectorAll("[data-utc]").forEach((el) => {
      const when = new Date(el.dataset.utc);
      if (isNaN(when.getTime())) return;
      const options = {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
                       hourCycle: "h23"};
      if (el.dataset.style !== "short") options.year = "numeric";
      // an option holds text only: what it says before the time comes with it
      el.textContent = (el.dataset.before || "") + when.toLocaleString(undefined, options);
      el.dataset.local = "1";
    });
  }
  window.agentboxLocalTimes = localTimes;

  function byRun(runId) {
    return '[data-run-id="' + CSS.escape(runId) + '"]';
  }

  // Parts of a page that a musician reads (projects, exports, a review) are fetched
  // again when a run on them changes or finishes, so that a new review, or "waiting
  // for the render to finish", appears without a reload.
  let refreshing = null;
  function refreshRegions() {
    if (refreshing || !document.querySelector("[data-live-region]")) return;
    refreshing = setTimeout(() => {
      fetch(location.href, {headers: {"Accept": "text/html"}})
        .then((r) => r.ok ? r.text() : null)
        .then((html) => {
          refreshing = null;
          if (!html) return;
          const fresh = new DOMParser().parseFromString(html, "text/html");
          document.querySelectorAll("[data-live-region]").forEach((old) => {
            const found = fresh.getElementById(old.id);
            if (found) { old.replaceWith(found); localTimes(found); }
          });
        })
        .catch(() => { refreshing = null; });
    }, 300);
  }

  // The operator's views show a run's state by its own name.
  function show(runId, status) {
    document.querySelectorAll(byRun(runId) + " .status").forEach((cell) => {
      cell.textContent = status; cell.className = "status " + status;
    });
  }

  // Changes made while the page loaded, or while the server restarted, are not in
  // the stream: ask for the current state of every unfinished run on the page.
  function catchUp() {
    if (document.querySelector("[data-live-region] [data-pending], [data-live-region][data-pending]")) {
      refreshRegions();  // a region pending itself (a run's page) or holding one
    }
    const pending = new Set();
    document.querySelectorAll("[data-run-id] .status").forEach((cell) => {
      if (!TERMINAL.has(cell.textContent.trim())) {
        pending.add(cell.closest("[data-run-id]").dataset.runId);
      }
    });
    pending.forEach((runId) => {
      fetch("/runs/" + encodeURIComponent(runId), {headers: {"Accept": "application/json"}})
        .then((r) => r.ok ? r.json() : null)
        .then((run) => { if (run) show(run.run_id, run.status); })
        .catch(() => {});
    });
  }

  function addRunRow(run) {
    const table = document.getElementById("runs-live");
    if (!table || document.querySelector("tr" + byRun(run.run_id))) return;
    const row = table.insertRow(0);
    row.dataset.runId = run.run_id;
    const cells = [run.run_id, run.status, run.event_type, "", run.agent, "just now", ""];
    cells.forEach((text, i) => {
      const cell = row.insertCell(i);
      if (i === 0) {
        const link = document.createElement("a");
        link.href = "/ui/runs/" + encodeURIComponent(run.run_id); link.textContent = text;
        cell.appendChild(link); cell.className = "mono";
      } else if (i === 1) {
        const badge = document.createElement("span");
        badge.className = "status " + text; badge.textContent = text; cell.appendChild(badge);
      } else { cell.textContent = text; }
    });
  }

  function follow() {
    const live = document.getElementById("live");
    if (!live) return;  // the login page: no stream to follow before a session
    const source = new EventSource("/ui/stream");
    source.onopen = () => { live.textContent = "live"; live.className = "on"; catchUp(); };
    source.onerror = () => { live.textContent = "reconnecting…"; live.className = ""; };
    source.addEventListener("run", (message) => {
      const run = JSON.parse(message.data);
      show(run.run_id, run.status);
      const shown = document.querySelector("[data-live-region] " + byRun(run.run_id)) ||
                    document.querySelector("[data-live-region]" + byRun(run.run_id));
      if (shown || TERMINAL.has(run.status) || run.status === "accepted") refreshRegions();
      addRunRow(run);
    });
    source.addEventListener("stats", (message) => {
      const stats = JSON.parse(message.data);
      for (const [key, value] of Object.entries(stats)) {
        document.querySelectorAll('[data-stat="' + key + '"]').forEach((el) => {
          el.textContent = value;
        });
      }
    });
  }

  localTimes(document);
  follow();
})();
