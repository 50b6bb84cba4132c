// Asks before the actions that act on many jobs or cannot be undone: a form
// with a data-confirm attribute (retry all dead, cancel, fire a schedule now)
// is sent only once the question is answered OK. A listener on the document,
// so the forms htmx swaps in every 5 s are covered too.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute ? form.getAttribute("data-confirm") : null;
    if (question && !window.confirm(question)) event.preventDefault();
  }, true);
})();
