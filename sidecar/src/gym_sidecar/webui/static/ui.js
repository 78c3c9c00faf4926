// gym-telemetry web view: the project's only script (served from /static/, as the
// Content-Security-Policy requires). It refreshes regions marked data-refresh="N" every
// N seconds in place, by fetching the same page and swapping the region, and pauses
// while the tab is hidden. Without it, those pages reload themselves (<noscript> meta).
"use strict";
(function () {
  function refresh(region) {
    var seconds = parseInt(region.getAttribute("data-refresh"), 10);
    if (!(seconds > 0)) return;
    setInterval(function () {
      if (document.hidden) return;
      fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (text) {
          if (text === null) return;
          var doc = new DOMParser().parseFromString(text, "text/html");
          var fresh = doc.getElementById(region.id);
          if (fresh) {
            region.replaceChildren.apply(region, Array.prototype.slice.call(fresh.childNodes));
            region.setAttribute("data-refreshed", String(Date.now()));
          }
        })
        .catch(function () { /* the view is down for a moment: try again next time */ });
    }, seconds * 1000);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh][id]").forEach(refresh);
  });
})();
