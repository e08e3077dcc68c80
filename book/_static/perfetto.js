/* "Open in Perfetto" for the trace links that kernels.trace.links.links() puts beside a figure.
 *
 * The link box carries the trace's URL relative to the page (data-trace-url), the title
 * Perfetto should show (data-trace-title) and the file name (data-trace-file). A click:
 *   1. opens the Perfetto UI in a new window (inside the click, or pop-up blockers stop it),
 *   2. fetches the trace's bytes from this site meanwhile,
 *   3. posts "PING" to the new window every 50 ms until it answers "PONG": the window's
 *      message channel is not buffered, so anything sent before its listener exists is lost,
 *   4. posts {perfetto: {buffer, title, fileName}}: the exact bytes of the published file.
 *      Perfetto reads gzip-compressed traces as they are.
 * Over HTTPS the trace also has a public URL, so a second link uses Perfetto's own
 * ?url= deep link (Perfetto fetches the file; the host must allow CORS, as GitHub Pages does).
 *
 * Where the UI lives is configurable, for a self-hosted Perfetto or for a test's stand-in:
 * a data-perfetto-url attribute on the link box, else window.AP_PERFETTO_URL, else
 * https://ui.perfetto.dev.
 */
(function () {
  "use strict";
  var DEFAULT_UI = "https://ui.perfetto.dev";
  var PING_EVERY_MS = 50;
  var GIVE_UP_AFTER_MS = 30000;

  function perfettoUrl(box) {
    return box.getAttribute("data-perfetto-url") || window.AP_PERFETTO_URL || DEFAULT_UI;
  }

  function traceUrl(box) {
    return new URL(box.getAttribute("data-trace-url"), document.baseURI).href;
  }

  function say(box, text) {
    var note = box.querySelector(".ap-trace-status");
    if (!note) {
      note = document.createElement("span");
      note.className = "ap-trace-status";
      note.setAttribute("role", "status");
      box.appendChild(note);
    }
    note.textContent = text;
  }

  function openInPerfetto(box) {
    var ui = perfettoUrl(box);
    var origin = new URL(ui, document.baseURI).origin;
    if (location.protocol === "file:") {
      say(box, "Opening in Perfetto needs the book served over http(s); download the trace and open it in Perfetto instead.");
      return;
    }
    var win = window.open(ui);
    if (!win) {
      say(box, "The browser blocked the new window: allow pop-ups for this site, or download the trace.");
      return;
    }
    var bytes = fetch(traceUrl(box)).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.arrayBuffer();
    });
    var started = Date.now();
    var timer = null;

    function stop() {
      clearInterval(timer);
      window.removeEventListener("message", onMessage);
    }

    function onMessage(event) {
      if (event.source !== win || event.data !== "PONG") return;
      stop();
      bytes.then(function (buffer) {
        win.postMessage({
          perfetto: {
            buffer: buffer,
            title: box.getAttribute("data-trace-title") || "trace",
            fileName: box.getAttribute("data-trace-file") || undefined,
          },
        }, origin);
        say(box, "Sent to Perfetto (" + Math.round(buffer.byteLength / 1024) + " KiB).");
      }).catch(function (err) {
        say(box, "Could not fetch the trace (" + err.message + "); try Download trace.");
      });
    }

    window.addEventListener("message", onMessage);
    timer = setInterval(function () {
      if (win.closed || Date.now() - started > GIVE_UP_AFTER_MS) {
        stop();
        say(box, "Perfetto did not answer; download the trace and open it at " + ui + ".");
        return;
      }
      // Before the UI has loaded the window is still on about:blank: the target origin
      // keeps this message from going anywhere else.
      win.postMessage("PING", origin);
    }, PING_EVERY_MS);
    say(box, "Opening Perfetto…");
  }

  function addUrlLinks() {
    if (location.protocol !== "https:") return;
    var boxes = document.querySelectorAll(".ap-trace");
    for (var i = 0; i < boxes.length; i++) {
      var box = boxes[i];
      if (box.querySelector(".ap-trace-url")) continue;
      var link = document.createElement("a");
      link.className = "ap-trace-url";
      link.href = perfettoUrl(box) + "/#!/?url=" + encodeURI(traceUrl(box));
      link.target = "_blank";
      link.rel = "noopener";
      link.textContent = "Open in Perfetto (by URL)";
      link.title = "Perfetto downloads the trace from this site itself";
      box.insertBefore(link, box.querySelector(".ap-trace-info"));
    }
  }

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a.ap-trace-perfetto");
    if (!link) return;
    event.preventDefault();
    openInPerfetto(link.closest(".ap-trace"));
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", addUrlLinks);
  } else {
    addUrlLinks();
  }
  window.AP_TRACES_READY = true;
})();
