// The queue page's live feed: the queue's events (GET .../events, server-sent
// events) as a list, newest first. Text only (textContent), never HTML.
// The filters above it (event, kind, and progress events: hidden by default,
// a running job may report many a second) hide the events that do not match;
// the last KEEP events are kept, so changing a filter shows the ones it hid.
(function () {
  "use strict";
  var box = document.getElementById("events");
  if (!box || !window.EventSource) return;
  var list = box.querySelector("ol.feed");
  var status = document.getElementById("events-status");
  var byEvent = document.getElementById("feed-event");
  var byKind = document.getElementById("feed-kind");
  var progress = document.getElementById("feed-progress");
  var KEEP = 300;
  var source = new EventSource(box.getAttribute("data-src"));

  function shown(item) {
    var ev = item.getAttribute("data-event") || "";
    var want = byEvent ? byEvent.value.trim() : "";
    var kind = byKind ? byKind.value.trim() : "";
    if (want) {
      if (ev !== want) return false;
    } else if (ev === "progress" && !(progress && progress.checked)) {
      return false;
    }
    return !kind || item.getAttribute("data-kind") === kind;
  }

  function refilter() {
    for (var i = 0; i < list.children.length; i++) list.children[i].hidden = !shown(list.children[i]);
  }

  [byEvent, byKind, progress].forEach(function (input) {
    if (input) {
      input.addEventListener("input", refilter);
      input.addEventListener("change", refilter);
    }
  });
  var filters = document.getElementById("feed-filters");
  if (filters) filters.addEventListener("submit", function (event) { event.preventDefault(); });

  function span(cls, text) {
    var el = document.createElement("span");
    el.className = cls;
    el.textContent = text;
    return el;
  }

  source.onopen = function () {
    status.textContent = "Following the queue's events as they happen (newest first).";
  };
  source.onerror = function () {
    status.textContent = source.readyState === EventSource.CLOSED
      ? "The event stream is off for this queue (reload the page once it is on)."
      : "Reconnecting to the event stream…";
  };
  source.addEventListener("venturi", function (message) {
    var e = JSON.parse(message.data);
    var item = document.createElement("li");
    item.className = "event";
    item.setAttribute("data-event", e.event);
    item.setAttribute("data-kind", e.kind || "");
    item.appendChild(span("at", (e.at || "").replace("T", " ").slice(0, 19) + "Z"));
    item.appendChild(span("ev", e.event));
    if (e.job_id) {
      var link = document.createElement("a");
      link.className = "id";
      link.href = box.getAttribute("data-job") + encodeURIComponent(e.job_id);
      link.textContent = e.job_id;
      item.appendChild(link);
      item.appendChild(span("kind", e.kind));
    }
    if (e.run) item.appendChild(span("run", "run " + e.run));
    if (e.value !== null && e.value !== undefined) item.appendChild(span("value", JSON.stringify(e.value)));
    if (e.note) item.appendChild(span("note", e.note.slice(0, 200)));
    item.hidden = !shown(item);
    list.insertBefore(item, list.firstChild);
    while (list.children.length > KEEP) list.removeChild(list.lastChild);
  });
})();
