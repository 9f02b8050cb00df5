// MathJax for pymdownx.arithmatex (generic mode): typeset \( \) and \[ \] on every page load.
// MathJax itself is served from the site (javascripts/mathjax/, copied in by tools/docs/hooks.py).
// An unknown command is an error (red box, caught by nox -s docs-browser), not silently red text.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
    packages: { "[-]": ["noundefined"] },
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
