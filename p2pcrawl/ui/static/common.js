// Shared by status.html and network.html; the status server inlines it where a page says
// "include: common.js". Every value reaches the DOM as text, never as markup: host names,
// addresses, node IDs and event details come from the network.
const token = new URLSearchParams(location.search).get("token");
const authHeaders = token ? { Authorization: "Bearer " + token } : {};
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

const fmt = {
  text: (v) => (v === undefined || v === null || v === "" ? "–" : String(v)),
  int: (v) => (typeof v === "number" ? Math.round(v).toLocaleString("en-US") : "–"),
  rate: (v) => (typeof v === "number" ? (v >= 100 ? v.toFixed(0) : v.toFixed(1)) : "–"),
  pct: (v) => (typeof v === "number" ? (100 * v).toFixed(0) + "%" : "–"),
  ms: (v) => (typeof v === "number" ? v.toFixed(0) + " ms" : "–"),
  bytes: (v) => {
    if (typeof v !== "number") return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  },
  duration: (s) => {
    if (typeof s !== "number") return "–";
    if (s < 60) return s.toFixed(1) + " s";
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24;
    const m = Math.floor(s / 60) % 60, sec = Math.floor(s) % 60;
    const two = (n) => String(n).padStart(2, "0");
    return (d ? d + "d " : "") + (d || h ? h + "h " + two(m) : m) + "m " + two(sec) + "s";
  },
  secs: (s) => (typeof s === "number" ? (s < 1 ? (s * 1000).toFixed(0) + " ms"
                                                : s.toFixed(s < 10 ? 2 : 0) + " s") : "–"),
};

async function getJSON(path) {
  const resp = await fetch(path, { headers: authHeaders, cache: "no-store" });
  if (!resp.ok) {
    let msg = resp.status + " " + resp.statusText;
    try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new Error(path + ": " + msg);
  }
  return resp.json();
}
