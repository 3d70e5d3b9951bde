// The home page's "Find a project": as the name is typed, the projects whose name
// holds it replace the list (the page itself, GET /?q=NAME, fetched and read: the
// same page the form gives without JavaScript), and the address says what was asked.
(function () {
  "use strict";
  const form = document.getElementById("find-project");
  const input = document.getElementById("find-q");
  if (!form || !input) return;
  let waiting = null;
  let asking = null;
  function find() {
    const q = input.value.trim();
    const url = q ? "/?q=" + encodeURIComponent(q) : "/";
    if (asking) asking.abort();
    asking = new AbortController();
    fetch(url, {headers: {"Accept": "text/html"}, signal: asking.signal})
      .then((r) => r.ok ? r.text() : null)
      .then((html) => {
        if (!html) return;
        const fresh = new DOMParser().parseFromString(html, "text/html");
        const found = fresh.getElementById("projects");
        const shown = document.getElementById("projects");
        if (found && shown) {
          shown.replaceWith(found);
          if (window.agentboxLocalTimes) window.agentboxLocalTimes(found);  // page.js
        }
        history.replaceState(null, "", url);
      })
      .catch(() => {});
  }
  input.addEventListener("input", () => {
    clearTimeout(waiting);
    waiting = setTimeout(find, 200);
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearTimeout(waiting);
    find();
  });
})();
