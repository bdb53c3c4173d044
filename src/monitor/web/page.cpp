// The dashboard's page: static HTML and one script. Every value that comes from peers is put
// into the page with textContent (never innerHTML), so a record cannot inject markup; the
// server's Content-Security-Policy allows only these same-origin scripts besides.
#include "page.hpp"

namespace starling::monitor {

std::string_view page_html() {
  return R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Starling run monitor</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .6em 0; }
#status { font-size: .8em; color: #777; margin-left: 1em; }
.cards { display: flex; flex-wrap: wrap; gap: .8em; margin-bottom: 1em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .5em .9em; min-width: 8em; }
.card .k { font-size: .75em; color: #666; } .card .v { font-size: 1.3em; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(320px, 1fr)); gap: 1em; }
.chart { position: relative; height: 220px; border: 1px solid #eee; padding: .3em; }
.chart h2 { font-size: .85em; margin: 0; color: #555; }
table { border-collapse: collapse; margin-top: 1em; font-size: .9em; }
th, td { border-bottom: 1px solid #eee; padding: .25em .7em; text-align: right; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
td.peer { font-family: monospace; }
</style>
</head>
<body data-updates="0">
<h1>Run <span id="run">?</span><span id="status">connecting...</span></h1>
<div class="cards">
  <div class="card"><div class="k">epoch</div><div class="v" id="epoch">-</div></div>
  <div class="card"><div class="k">contributors</div><div class="v" id="peers">-</div></div>
  <div class="card"><div class="k">samples/s</div><div class="v" id="sps">-</div></div>
  <div class="card"><div class="k">next step</div><div class="v" id="progress">-</div></div>
  <div class="card"><div class="k">ETA next step</div><div class="v" id="eta">-</div></div>
  <div class="card"><div class="k">loss</div><div class="v" id="loss">-</div></div>
  <div class="card"><div class="k">held-out accuracy</div><div class="v" id="accuracy">-</div></div>
  <div class="card"><div class="k">held-out perplexity</div><div class="v" id="perplexity">-</div></div>
  <div class="card"><div class="k">samples (live peers)</div><div class="v" id="samples">-</div></div>
  <div class="card"><div class="k">bytes up / down</div><div class="v" id="bytes">-</div></div>
</div>
<div id="charts-note"></div>
<div class="charts">
  <div class="chart"><h2>loss</h2><canvas id="loss-chart" data-points="0"></canvas></div>
  <div class="chart"><h2>samples/s (collaboration)</h2><canvas id="sps-chart" data-points="0"></canvas></div>
  <div class="chart"><h2>held-out accuracy</h2><canvas id="acc-chart" data-points="0"></canvas></div>
  <div class="chart"><h2>held-out perplexity</h2><canvas id="ppl-chart" data-points="0"></canvas></div>
  <div class="chart"><h2>bytes per epoch</h2><canvas id="bytes-chart" data-points="0"></canvas></div>
</div>
<table id="contributors">
<thead><tr><th>peer</th><th>name</th><th>epoch</th><th>samples</th><th>samples/s</th><th>loss</th>
<th>accuracy</th><th>reachability</th><th>up / down</th><th>rounds ok / failed</th><th>uptime</th><th>last seen</th></tr></thead>
<tbody></tbody>
</table>
<script src="/chart.js"></script>
<script src="/dashboard.js"></script>
</body>
</html>
)HTML";
}

std::string_view page_script() {
  return R"JS('use strict';
const $ = (id) => document.getElementById(id);
const latencies = [];
window.starlingLatencies = latencies;
let updates = 0;

function num(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return '-';
  return Number(v).toLocaleString('en-US', {maximumFractionDigits: digits});
}
function bytes(b) {
  const u = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (b >= 1000 && i < u.length - 1) { b /= 1000; i++; }
  return num(b, i ? 1 : 0) + ' ' + u[i];
}
function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return '-';
  if (s >= 3600) return num(s / 3600, 1) + ' h';
  if (s >= 60) return num(s / 60, 1) + ' min';
  return num(s, 0) + ' s';
}
function shortPeer(p) {
  return p.length > 16 ? p.slice(0, 8) + '\u2026' + p.slice(-6) : p;
}

function makeChart(id, label, color, type) {
  return new Chart($(id), {
    type: type || 'line',
    data: {datasets: [{label: label, data: [], borderColor: color, backgroundColor: color,
                       pointRadius: 0, borderWidth: 2}]},
    options: {animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
              scales: {x: {type: 'linear', title: {display: true, text: type === 'bar' ? 'epoch' : 'seconds'}}},
              plugins: {legend: {display: false}}}
  });
}
let charts = null;
if (typeof Chart !== 'undefined') {
  charts = {
    loss: makeChart('loss-chart', 'loss', '#c0392b'),
    sps: makeChart('sps-chart', 'samples/s', '#2471a3'),
    acc: makeChart('acc-chart', 'accuracy', '#1e8449'),
    ppl: makeChart('ppl-chart', 'perplexity', '#b9770e'),
    bytes: makeChart('bytes-chart', 'bytes', '#7d3c98', 'bar'),
  };
} else {
  $('charts-note').textContent = 'Charts unavailable: Chart.js is not installed on the monitor (libjs-chart.js).';
}

function setChart(chart, id, points) {
  if (!chart) return;
  chart.data.datasets[0].data = points;
  chart.update('none');
  $(id).dataset.points = String(points.length);
}

function bytesPerEpoch(history) {
  const first = new Map();
  for (const p of history) if (!first.has(p.epoch)) first.set(p.epoch, p.bytes);
  const epochs = [...first.keys()].sort((a, b) => a - b);
  const out = [];
  for (let i = 1; i < epochs.length; i++) {
    const d = (first.get(epochs[i]) - first.get(epochs[i - 1])) / (epochs[i] - epochs[i - 1]);
    if (d >= 0) out.push({x: epochs[i - 1], y: d});
  }
  return out;
}

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function render(s) {
  const t = s.totals;
  $('run').textContent = s.run_id;
  $('epoch').textContent = String(t.epoch);
  $('peers').textContent = String(t.peers);
  $('sps').textContent = num(t.samples_per_second, 1);
  $('progress').textContent = t.target_batch_size ? num(t.samples_accumulated, 0) + ' / ' + num(t.target_batch_size, 0) : '-';
  $('eta').textContent = duration(t.eta_s);
  $('loss').textContent = num(t.loss, 4);
  $('accuracy').textContent = t.eval_accuracy === null ? '-' : num(t.eval_accuracy, 4) + ' (epoch ' + t.eval_epoch + ')';
  $('perplexity').textContent = t.eval_perplexity === null ? '-' : num(t.eval_perplexity, 2) + ' (epoch ' + t.eval_epoch + ')';
  $('samples').textContent = num(t.samples_total, 0);
  $('bytes').textContent = bytes(t.bytes_sent) + ' / ' + bytes(t.bytes_received);
  const rows = [];
  for (const c of s.contributors) {
    const tr = document.createElement('tr');
    tr.dataset.peer = c.peer;
    cell(tr, shortPeer(c.peer), 'peer').title = c.peer;
    cell(tr, c.name, 'name');
    cell(tr, String(c.epoch));
    cell(tr, num(c.samples_total, 0));
    cell(tr, num(c.samples_per_second, 1));
    cell(tr, num(c.loss, 4));
    cell(tr, num(c.eval_accuracy, 4));
    cell(tr, c.reachability);
    cell(tr, bytes(c.bytes_sent) + ' / ' + bytes(c.bytes_received));
    cell(tr, c.rounds_ok + ' / ' + c.rounds_failed);
    cell(tr, duration(c.uptime_s));
    cell(tr, duration(c.age_s) + ' ago');
    rows.push(tr);
  }
  $('contributors').tBodies[0].replaceChildren(...rows);
  if (charts) {
    setChart(charts.loss, 'loss-chart', s.history.filter((p) => p.loss !== null).map((p) => ({x: p.t, y: p.loss})));
    setChart(charts.sps, 'sps-chart', s.history.map((p) => ({x: p.t, y: p.samples_per_second})));
    setChart(charts.acc, 'acc-chart', s.history.filter((p) => p.eval_accuracy !== null).map((p) => ({x: p.t, y: p.eval_accuracy})));
    setChart(charts.ppl, 'ppl-chart', s.history.filter((p) => p.eval_perplexity !== null).map((p) => ({x: p.t, y: p.eval_perplexity})));
    setChart(charts.bytes, 'bytes-chart', bytesPerEpoch(s.history));
  }
  updates++;
  if (s.generated_unix_ms > 0) {
    latencies.push(Date.now() - s.generated_unix_ms);
    if (latencies.length > 1000) latencies.shift();
  }
  document.body.dataset.updates = String(updates);
  document.body.dataset.epoch = String(t.epoch);
  $('status').textContent = 'live \u00b7 ' + new Date().toLocaleTimeString();
}

async function poll() {
  for (;;) {
    try {
      const r = await fetch('/api/state', {cache: 'no-store'});
      if (r.ok) render(await r.json());
    } catch (e) {
      $('status').textContent = 'monitor unreachable, retrying';
    }
    await new Promise((done) => setTimeout(done, 2000));
  }
}

function connect() {
  if (!window.EventSource) { poll(); return; }
  const es = new EventSource('/events');
  es.onmessage = (e) => render(JSON.parse(e.data));
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) { es.close(); poll(); }
    else $('status').textContent = 'reconnecting...';
  };
}
connect();
)JS";
}

}  // namespace starling::monitor
