// pgq_supervisor dashboard: follow a page's changes by short polling with ETags.
// A page whose <main> has data-live="ms" asks for its live part every ms milliseconds with the
// ETag it holds; the server answers 304 while nothing changed. Paused while the tab is hidden
// and while the user has a <details> open or text selected there, so nothing jumps under them.
(function () {
  "use strict";
  var main = document.getElementById("live");
  if (!main || !main.dataset.live) { return; }
  var every = parseInt(main.dataset.live, 10) || 2000;
  var etag = null;
  function busy() {
    var sel = window.getSelection && window.getSelection();
    return document.hidden || main.querySelector("details[open]") !== null ||
      (sel && !sel.isCollapsed && main.contains(sel.anchorNode));
  }
  function poll() {
    if (busy()) { setTimeout(poll, every); return; }
    var headers = { "X-Pgq-Live": "1" };
    if (etag) { headers["If-None-Match"] = etag; }
    fetch(window.location.href, { headers: headers, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 200) {
          etag = r.headers.get("ETag");
          return r.text().then(function (html) { main.innerHTML = html; });
        }
      })
      .catch(function () { /* the next poll tries again */ })
      .then(function () { setTimeout(poll, every); });
  }
  setTimeout(poll, every);
})();
