// aiojobqueue dashboard: live updates by server-sent events, and confirmation prompts.
// The project's own small script (no framework, no CDN).
(function () {
  "use strict";
  const main = document.getElementById("main");
  const badge = document.getElementById("live");
  const url = document.body.dataset.live;

  // Times read "2 min ago"; hovering one shows it in the reader's own time zone.
  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (t) {
      const d = new Date(t.getAttribute("datetime"));
      if (!isNaN(d)) t.title = d.toLocaleString();
    });
  }
  localTimes(document);

  // A change on the server re-renders this page's <main> (the server sends just that part).
  let busy = false, again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const el = document.activeElement;
      const typing = el && main.contains(el) && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
      if (!typing) {
        const r = await fetch(location.href, { headers: { "X-AJQ-Fragment": "1" }, cache: "no-store" });
        if (r.ok) {
          main.innerHTML = await r.text();
          localTimes(main);
          document.body.dataset.updated = String(Date.now());
        }
      }
    } catch (e) {
      // the next change retries; a dead server shows as "live" going grey
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  if (url && window.EventSource) {
    const es = new EventSource(url);
    es.addEventListener("hello", function () { badge.classList.replace("off", "on"); });
    es.addEventListener("change", refresh);
    es.onerror = function () { badge.classList.replace("on", "off"); };
  }

  // Forms that change something ask first when they say so (single cancel).
  document.addEventListener("submit", function (ev) {
    const msg = ev.target.dataset && ev.target.dataset.confirm;
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
})();
