// A long code name in a title or a menu entry (scaled_dot_product_attention) may break after
// an underscore, where a reader expects it to, rather than anywhere (book/_static/pages.css).
document.addEventListener("DOMContentLoaded", function () {
  var names = document.querySelectorAll(
    ".bd-sidebar-primary .bd-links code span.pre, .bd-article :is(h1, h2, h3) code span.pre, .bd-toc code span.pre");
  names.forEach(function (name) {
    if (name.children.length === 0 && name.textContent.indexOf("_") > 0) {
      name.innerHTML = name.innerHTML.replace(/_(?=.)/g, "_<wbr>");
    }
  });
});

// A figure shrunk to a phone's column: a tap shows it at the size it was drawn, scrolling
// sideways in its own box (pages.css, figure.ap-zoomed); a second tap fits it again.
document.addEventListener("click", function (event) {
  var img = event.target.closest && event.target.closest(".bd-article .cell_output figure img");
  if (!img) return;
  var figure = img.closest("figure");
  if (figure.classList.contains("ap-zoomed") || img.naturalWidth > img.getBoundingClientRect().width + 1) {
    figure.classList.toggle("ap-zoomed");
  }
});
