// pgq_supervisor dashboard: confirmations, copy buttons, select-all. Without this script every
// destructive form still gets its confirmation, as a page from the server.
(function () {
  "use strict";
  // A form (or the button that submits it) with data-confirm asks first; "{n}" is the number
  // of jobs ticked in the form. Confirmed, the form is posted with confirmed=1 so the server
  // does not ask again; dismissed, nothing is sent.
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var button = e.submitter;
    var ask = (button && button.dataset.confirm) || form.dataset.confirm;
    if (!ask) { return; }
    var ticked = form.querySelectorAll('input[name="id"]:checked').length;
    if (ask.indexOf("{n}") >= 0 && ticked === 0) {
      e.preventDefault();
      window.alert("Tick the jobs to act on first.");
      return;
    }
    if (!window.confirm(ask.replace("{n}", String(ticked)))) {
      e.preventDefault();
      return;
    }
    var mark = form.querySelector('input[name="confirmed"]');
    if (!mark) {
      mark = document.createElement("input");
      mark.type = "hidden";
      mark.name = "confirmed";
      form.appendChild(mark);
    }
    mark.value = "1";
  });

  function copied(button) {
    button.classList.add("done");
    setTimeout(function () { button.classList.remove("done"); }, 1200);
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button.copy");
    if (button) {
      var text = button.dataset.copy;
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { copied(button); });
      } else {  // plain http on another host: the old way
        var area = document.createElement("textarea");
        area.value = text;
        document.body.appendChild(area);
        area.select();
        document.execCommand("copy");
        document.body.removeChild(area);
        copied(button);
      }
      return;
    }
    if (e.target.id === "select-all") {
      var boxes = document.querySelectorAll('#bulk input[name="id"]');
      for (var i = 0; i < boxes.length; i++) { boxes[i].checked = e.target.checked; }
    }
  });
})();
