// The Brain dashboard's only script of its own: live approvals over server-sent events,
// and selecting a just-created secret on focus. No inline script anywhere (CSP: script-src 'self').
(function () {
  "use strict";
  function start() {
    var live = document.querySelector("[data-live]");
    if (live && window.EventSource && window.htmx) {
      var source = new EventSource("/brain/approvals/stream");
      source.addEventListener("approvals", function () {
        window.htmx.ajax("GET", live.getAttribute("data-live"), { target: live, swap: "innerHTML" });
      });
    }
    document.querySelectorAll("[data-select]").forEach(function (el) {
      el.addEventListener("focus", function () { el.select(); });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
