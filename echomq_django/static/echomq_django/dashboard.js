// The dashboard refreshes itself (docs/howto/operate.md#the-dashboard): it
// fetches the JSON endpoint every data-refresh-s seconds while the tab is
// visible and swaps in the body the server rendered. No library.
(function () {
  "use strict";
  var box = document.getElementById("emq-dashboard");
  var status = document.getElementById("emq-updated");
  if (!box) { return; }
  var every = 1000 * (parseInt(box.dataset.refreshS, 10) || 10);
  function refresh() {
    if (document.hidden) { return; }
    fetch(box.dataset.json, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (data) {
        if (data.live_error) {  // Redis away: keep the last numbers, say why
          status.textContent = "Could not read Redis: " + data.live_error + "; retrying.";
          return;
        }
        box.innerHTML = data.html;
        box.dataset.at = String(data.at);
        status.textContent = "Read live from Redis; updated " + new Date(data.at).toLocaleTimeString() + ".";
      })
      .catch(function (err) { status.textContent = "Could not refresh: " + err.message + "; retrying."; });
  }
  setInterval(refresh, every);
  box.refreshNow = refresh;  // for the browser tests
})();
