// agemem console: the one script the pages load (the Content-Security-Policy
// allows no other). Every page works without it; it only keeps live pages
// current: a page whose <body> has data-refresh="N" re-reads itself every N
// seconds and swaps in its new <main>, unless the visitor is typing or has
// a section open, so a form is never lost under their hands.
"use strict";
(function () {
  var secs = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!(secs > 0)) {
    return;
  }
  function busy() {
    var a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "TEXTAREA" || a.tagName === "SELECT")) {
      return true;
    }
    return document.querySelector("main details[open]") !== null;
  }
  function refresh() {
    if (document.hidden || busy()) {
      return;
    }
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        // DOMParser builds an inert document: nothing in it runs.
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        var cur = document.getElementById("main");
        if (fresh && cur) {
          cur.replaceWith(document.importNode(fresh, true));
        }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  setInterval(refresh, secs * 1000);
})();
