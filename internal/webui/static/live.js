// live.js keeps a page's live region current from the server-sent event
// stream the region names (data-stream): the server pushes the region's
// new HTML only when what it shows changed. It also asks before the forms
// marked data-confirm are sent. Nothing else runs on the pages.
(function () {
  'use strict';
  var region = document.getElementById('live');
  var status = document.getElementById('live-status');
  function mark(state, text) {
    if (!status) { return; }
    status.className = 'live-status ' + state;
    status.textContent = text;
  }
  if (region && region.dataset.stream && window.EventSource) {
    var es = new EventSource(region.dataset.stream);
    es.addEventListener('open', function () { mark('on', 'live'); });
    es.addEventListener('html', function (e) {
      region.innerHTML = e.data;
      mark('on', 'live');
    });
    es.addEventListener('stop', function (e) {
      es.close();
      mark('off', e.data || 'stopped');
    });
    es.addEventListener('error', function () {
      if (es.readyState !== EventSource.CLOSED) { mark('off', 'reconnecting'); }
    });
  } else {
    mark('off', 'static');
  }
  document.addEventListener('submit', function (e) {
    var msg = e.target.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });
}());
