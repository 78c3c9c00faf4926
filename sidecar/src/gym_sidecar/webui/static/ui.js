// gym-telemetry web view: the project's only script (served from /static/, as the
// Content-Security-Policy requires). It refreshes regions marked data-refresh="N" every
// N seconds in place, by fetching the same page and swapping the region, and pauses
// while the tab is hidden. One fetch at a time per region: the next is scheduled when
// the last one ended; while the page does not answer OK the wait doubles, up to a minute
// (a view or sidecar that is down is not hammered), and returns to N seconds once it
// does. Without this script, those pages reload themselves (<noscript> meta).
"use strict";
(function () {
  var MAX_DELAY_MS = 60000;
  function refresh(region) {
    var seconds = parseInt(region.getAttribute("data-refresh"), 10);
    if (!(seconds > 0)) return;
    var delay = seconds * 1000;
    function schedule(ok) {
      delay = ok ? seconds * 1000 : Math.min(MAX_DELAY_MS, delay * 2);
      setTimeout(tick, delay);
    }
    function tick() {
      if (document.hidden) { setTimeout(tick, delay); return; }
      fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          return r.text().then(function (text) { return { ok: r.ok, text: text }; });
        })
        .then(function (answer) {
          // an error page may carry the region too (the live page says why it is stale)
          var doc = new DOMParser().parseFromString(answer.text, "text/html");
          var fresh = doc.getElementById(region.id);
          if (fresh) {
            region.replaceChildren.apply(region, Array.prototype.slice.call(fresh.childNodes));
            region.setAttribute("data-refreshed", String(Date.now()));
          }
          schedule(answer.ok);
        })
        .catch(function () { schedule(false); /* the view is down for a moment */ });
    }
    setTimeout(tick, delay);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh][id]").forEach(refresh);
  });
})();
