// The review's box for a file to review (home page, a project's page). A file of its
// own, not inline, so that the page runs under a Content-Security-Policy without
// 'unsafe-inline'.
(function () {
  "use strict";

  // A file to review (the home page's and a project page's form): sent when "Review"
  // is pressed (a file chosen waits, so that the stage beside it can be read and
  // chosen first) or at once when one is dropped on the box, as the form would send
  // it, then the review's page, where it comes in. A refusal (not audio, too large,
  // no room) is said here.
  function dropZone(form) {
    const input = form.querySelector("input[type=file]");
    const said = document.getElementById("drop-status");
    const most = Number(form.dataset.maxBytes) || Infinity;
    const say = (text, refused) => {  // a refusal stands out; progress stays quiet
      said.textContent = text; said.className = refused ? "refused" : "muted";
    };
    const send = () => {
      const file = input.files[0];
      if (!file) { say("Choose an audio file first.", true); return; }
      if (file.size > most) {
        say(file.name + " is larger than " + Math.floor(most / 1048576) +
          " MiB, the most agentbox takes from the page: export a shorter or compressed " +
          "(FLAC) file.", true);
        return;
      }
      say("Sending " + file.name + "…", false);
      form.classList.add("sending");
      fetch(form.action, {method: "POST", body: new FormData(form),
                          headers: {"Accept": "application/json"}})
        .then((r) => r.json().catch(() => ({message: r.status + " " + r.statusText}))
          .then((answer) => {
            if (!r.ok) throw new Error(answer.message || r.statusText);
            say(file.name + " is being reviewed…", false);
            location.assign("/ui/runs/" + encodeURIComponent(answer.run_id));
          }))
        .catch((err) => { say(err.message, true); form.classList.remove("sending"); });
    };
    form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
    input.addEventListener("change", () => {
      const file = input.files[0];
      if (file) say(file.name + ": choose how to judge it, then Review.", false);
    });
    ["dragenter", "dragover"].forEach((kind) => form.addEventListener(kind, (e) => {
      e.preventDefault(); form.classList.add("over");
    }));
    form.addEventListener("dragleave", (e) => {
      if (!form.contains(e.relatedTarget)) form.classList.remove("over");
    });
    form.addEventListener("drop", (e) => {
      e.preventDefault(); form.classList.remove("over");
      if (!e.dataTransfer.files.length) return;
      input.files = e.dataTransfer.files;
      send();
    });
  }

  const drop = document.getElementById("drop-form");
  if (drop) dropZone(drop);
})();
