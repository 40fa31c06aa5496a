// The search page opened from disk (file:): Sphinx's search finds the pages from its index (searchindex.js, loaded
// as a script), but it fetches each result page for its excerpt, which browsers refuse for file: URLs (one "Failed
// to fetch" per result). There the page asks for no excerpts and says how to get them: the site served on
// 127.0.0.1 by `make docs-serve`.
if (window.location.protocol === "file:") {
  DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
  document.addEventListener("DOMContentLoaded", () => {
    const results = document.getElementById("search-results");
    if (!results) return;
    const note = document.createElement("p");
    note.id = "search-offline-note";
    note.innerHTML =
      "Opened from disk, the search shows page titles only. For excerpts, serve the site: " +
      "<code>make docs-serve</code>, then open <code>http://127.0.0.1:8000/search.html</code>.";
    results.parentNode.insertBefore(note, results);
  });
}
