/* evalpipe results viewer: one classic inline script, no network, no HTML parsing of data.
 * Every piece of data reaches the page through textContent, Text nodes or element properties;
 * the CSP (script/style hashes, connect-src 'none', Trusted Types) backs that up. */
'use strict';
(function () {
  const errors = [];
  const violations = [];
  window.__viewerErrors = errors;
  window.__viewerViolations = violations;
  window.__viewerBusy = 0;
  window.__viewerReady = false;
  window.__viewerTimings = {};
  window.addEventListener('error', (e) => errors.push(String(e.message || e)));
  window.addEventListener('unhandledrejection', (e) =>
    errors.push('unhandled: ' + String((e.reason && e.reason.message) || e.reason)));
  document.addEventListener('securitypolicyviolation', (e) =>
    violations.push(e.violatedDirective + ' ' + (e.blockedURI || '')));

  const t0 = performance.now();
  const META = JSON.parse(document.getElementById('meta').textContent);
  const $ = (id) => document.getElementById(id);
  const fmt = new Intl.NumberFormat('en-US');

  // ------------------------------------------------------------------ DOM helpers (text only)

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === null || v === undefined || v === false) continue;
        if (k === 'class') el.className = v;
        else if (k === 'text') el.textContent = v;
        else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
        else if (k === 'value') el.value = v;
        else if (k === 'title' || k === 'type' || k === 'name' || k === 'role' || k === 'hidden' ||
                 k === 'readonly' || k === 'open' || k.startsWith('data-') || k.startsWith('aria-')) {
          el.setAttribute(k, v === true ? '' : String(v));
        } else throw new Error('attribute not allowed: ' + k);
      }
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  const str = (v) => (v === null || v === undefined) ? '' : (typeof v === 'string' ? v : JSON.stringify(v));
  const pre = (text) => h('pre', { class: 'text' }, str(text));
  const pct = (x) => (typeof x === 'number' && isFinite(x)) ? (100 * x).toFixed(1) : '–';
  const mark = (p) => p === 1 ? h('span', { class: 'pass', title: 'pass' }, '✓')
    : p === 0 ? h('span', { class: 'fail', title: 'fail' }, '✗') : h('span', { class: 'none', title: 'not graded' }, '–');
  function busy(delta) { window.__viewerBusy += delta; }
  async function guarded(fn) {
    busy(1);
    try { return await fn(); } catch (e) { errors.push(String((e && e.stack) || e)); setStatus('error: ' + e); }
    finally { busy(-1); }
  }
  function setStatus(text) { $('status').textContent = text; }

  // ------------------------------------------------------------------ decoding the packed blocks

  async function inflate(id) {
    const node = document.getElementById(id);
    if (!node) throw new Error('missing block ' + id);
    const b64 = node.textContent;
    let bytes;
    if (typeof Uint8Array.fromBase64 === 'function') bytes = Uint8Array.fromBase64(b64);
    else {
      const bin = atob(b64);
      bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return JSON.parse(await new Response(stream).text());
  }
  const blocks = new Map();
  function block(id) {
    if (!blocks.has(id)) blocks.set(id, inflate(id));
    return blocks.get(id);
  }
  async function detailOf(i) {
    const chunk = await block('s' + Math.floor(i / META.chunk));
    return chunk[i % META.chunk];
  }
  function textChunk(ref) {
    const starts = META.text_starts;
    let lo = 0, hi = starts.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (starts[mid] <= ref) lo = mid; else hi = mid - 1; }
    return lo;
  }
  async function textOf(ref) {
    if (typeof ref === 'string') return ref;
    const n = textChunk(ref);
    const chunk = await block('x' + n);
    return chunk[ref - META.text_starts[n]];
  }

  // ------------------------------------------------------------------ the index

  let IX = null; // columns of the sample index
  let N = 0;
  const benchIndex = new Map(META.benches.map((b, i) => [b.key, i]));
  const modelIndex = new Map(META.models.map((m, i) => [m, i]));
  let stringIndex = null;

  async function loadIndex() {
    const raw = await block('ix');
    N = raw.b.length;
    IX = {
      strings: raw.strings, v: raw.v,
      b: Int32Array.from(raw.b), m: Int32Array.from(raw.m), r: Int32Array.from(raw.r), i: Int32Array.from(raw.i),
      f1: Int32Array.from(raw.f1), f2: Int32Array.from(raw.f2), g: Int32Array.from(raw.g),
      p: Int8Array.from(raw.p), s: Int32Array.from(raw.s), e: Int32Array.from(raw.e),
    };
    stringIndex = new Map(raw.strings.map((s, i) => [s, i]));
    blocks.delete('ix');
  }
  const S = (k) => IX.strings[k];

  // ------------------------------------------------------------------ state and permalinks

  const KEYS = ['v', 'b', 'm', 'r', 'f1', 'f2', 'p', 's', 'e', 'q', 're', 'ob', 'om', 'or', 'ot',
    'cb', 'am', 'ar', 'bm', 'br', 'cf', 'ct'];
  const state = Object.fromEntries(KEYS.map((k) => [k, '']));
  function readHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ''));
    for (const k of KEYS) state[k] = params.get(k) || '';
    if (!['overview', 'samples', 'compare'].includes(state.v)) state.v = 'overview';
  }
  function hashOf() {
    const params = new URLSearchParams();
    for (const k of KEYS) if (state[k] !== '' && !(k === 'v' && state.v === 'overview')) params.set(k, state[k]);
    const text = params.toString();
    return text ? '#' + text : '#';
  }
  let writingHash = false;
  function writeHash(push) {
    const target = hashOf();
    if (target === (location.hash || '#')) return;
    try {
      if (push) history.pushState(null, '', target); else history.replaceState(null, '', target);
    } catch (e) {
      writingHash = true;
      location.hash = target;
    }
  }

  // ------------------------------------------------------------------ the virtual list

  class VList {
    constructor(el, rowHeight, renderRow, onPick) {
      this.el = el; this.rowHeight = rowHeight; this.renderRow = renderRow; this.onPick = onPick;
      this.items = new Int32Array(0); this.selected = -1;
      this.spacer = h('div', { class: 'spacer' });
      this.win = h('div', { class: 'win' });
      el.append(this.spacer, this.win);
      this.queued = false;
      el.addEventListener('scroll', () => this.queue());
      window.addEventListener('resize', () => this.queue());
      el.addEventListener('click', (ev) => {
        const row = ev.target.closest('.row');
        if (row) this.onPick(Number(row.dataset.pos));
      });
    }
    setItems(items) { this.items = items; this.spacer.style.height = (items.length * this.rowHeight) + 'px'; this.render(); }
    queue() { if (!this.queued) { this.queued = true; requestAnimationFrame(() => { this.queued = false; this.render(); }); } }
    render() {
      const height = this.el.clientHeight || 600;
      const first = Math.max(0, Math.floor(this.el.scrollTop / this.rowHeight) - 4);
      const last = Math.min(this.items.length, first + Math.ceil(height / this.rowHeight) + 8);
      const rows = [];
      for (let pos = first; pos < last; pos++) {
        const row = this.renderRow(this.items[pos], pos);
        row.classList.add('row');
        row.dataset.pos = String(pos);
        if (pos === this.selected) row.classList.add('sel');
        rows.push(row);
      }
      this.win.style.top = (first * this.rowHeight) + 'px';
      this.win.replaceChildren(...rows);
    }
    select(pos) {
      this.selected = pos;
      const top = pos * this.rowHeight, view = this.el.clientHeight || 600;
      if (top < this.el.scrollTop) this.el.scrollTop = top;
      else if (top + this.rowHeight > this.el.scrollTop + view) this.el.scrollTop = top + this.rowHeight - view;
      this.render();
    }
  }

  // ------------------------------------------------------------------ search

  let search = null; // {texts: lower-case shared texts, own: per-sample lower-case text, refs: per-sample text refs}
  let searchBuilding = null;
  function buildSearch() {
    if (searchBuilding) return searchBuilding;
    searchBuilding = (async () => {
      const started = performance.now();
      setStatus('indexing text for search…');
      const texts = [];
      for (let n = 0; n < META.text_starts.length; n++) {
        const chunk = await block('x' + n);
        for (const t of chunk) texts.push(t.toLowerCase());
      }
      const own = new Array(N), refs = new Array(N);
      for (let c = 0; c < META.sample_chunks; c++) {
        const id = 's' + c;
        const cached = blocks.has(id);
        const chunk = await block(id);
        if (!cached) blocks.delete(id); // keep memory to the search strings
        for (let k = 0; k < chunk.length; k++) {
          const d = chunk[k];
          const parts = [str(d.output), str(d.answer), str(d.rationale), str(d.question), str(d.given)];
          if (d.rubrics) parts.push(d.rubrics.map(str).join('\n'));
          if (d.analysis) parts.push(str(d.analysis.error_reason));
          const r = [];
          for (const msg of d.messages || []) {
            if (typeof msg[1] === 'number') r.push(msg[1]); else parts.push(str(msg[1]));
          }
          own[c * META.chunk + k] = parts.join('\u0001').toLowerCase();
          refs[c * META.chunk + k] = r;
        }
      }
      search = { texts, own, refs };
      window.__viewerTimings.search_index_ms = performance.now() - started;
      setStatus('');
    })();
    return searchBuilding;
  }
  // A search answers, for the samples that pass the other filters (`candidates`), which shared texts hold a hit
  // (textHit, by text) and which samples' own text does (own(i)); or {error}. Plain text is searched here; a
  // regular expression in a worker, as one can take for ever (a shared link's `(a+)+$` backtracks without end)
  // and only a worker can be stopped in the middle of a match.
  function matcher(q, regex) {
    if (regex) {
      try { new RegExp(q, 'im'); } catch (e) { return { error: 'bad regular expression: ' + e.message }; }
      return { hits: (candidates) => regexHits(q, candidates) };
    }
    const needle = q.toLowerCase();
    return {
      hits: async () => {
        const textHit = new Uint8Array(search.texts.length);
        for (let k = 0; k < search.texts.length; k++) textHit[k] = search.texts[k].includes(needle) ? 1 : 0;
        return { textHit, own: (i) => search.own[i].includes(needle) };
      },
    };
  }

  const REGEX_LIMIT_MS = 5000; // a regular expression's whole search; past it the worker is stopped
  let regex = null; // the worker: {worker, url, pending: the search it runs, or null}
  let regexId = 0;
  let workerPolicy = null;
  function regexWorkerMain() {
    // the worker's program: the search strings once, then a pattern at a time
    let texts = [], own = [];
    onmessage = (ev) => {
      const m = ev.data;
      if (m.texts) { texts = m.texts; own = m.own; return; }
      const re = new RegExp(m.q, 'im');
      postMessage({ id: m.id, started: true });
      const textHit = new Uint8Array(texts.length), ownHit = new Uint8Array(own.length);
      for (let k = 0; k < texts.length; k++) textHit[k] = re.test(texts[k]) ? 1 : 0;
      for (const i of m.candidates) ownHit[i] = re.test(own[i]) ? 1 : 0;
      postMessage({ id: m.id, textHit, ownHit }, [textHit.buffer, ownHit.buffer]);
    };
  }
  function startRegexWorker() {
    const url = URL.createObjectURL(new Blob(['(' + regexWorkerMain.toString() + ')();'], { type: 'text/javascript' }));
    if (window.trustedTypes && !workerPolicy) {
      // the CSP lets this one policy make a script URL: the worker's own blob, nothing else
      workerPolicy = trustedTypes.createPolicy('viewer-worker', {
        createScriptURL: (u) => { if (!regex || u !== regex.url) throw new Error('not the search worker'); return u; },
      });
    }
    regex = { worker: null, url, pending: null };
    regex.worker = new Worker(workerPolicy ? workerPolicy.createScriptURL(url) : url);
    regex.worker.onmessage = (ev) => { if (regex && regex.pending) regex.pending.message(ev.data); };
    regex.worker.onerror = (ev) => { ev.preventDefault(); stopRegexWorker({ error: 'regular expression search failed: ' + ev.message }); };
    regex.worker.postMessage({ texts: search.texts, own: search.own });
  }
  function stopRegexWorker(result) {
    // the worker and its copy of the texts go; the search it ran ends with `result`
    if (!regex) return;
    const { worker, url, pending } = regex;
    regex = null;
    worker.terminate();
    URL.revokeObjectURL(url);
    if (pending) pending.finish(result);
  }
  function regexHits(q, candidates) {
    if (regex && regex.pending) stopRegexWorker({ stale: true }); // still on an earlier pattern: not wanted any more
    if (!regex) {
      try { startRegexWorker(); } catch (e) {
        regex = null;
        return Promise.resolve({ error: 'regular expressions search in a Web Worker, which this browser refused here: ' + e.message });
      }
    }
    return new Promise((resolve) => {
      const id = ++regexId;
      let timer = 0;
      const pending = {
        finish: (result) => { clearTimeout(timer); if (regex && regex.pending === pending) regex.pending = null; resolve(result); },
        message: (data) => {
          if (data.id !== id) return;
          if (data.started) {
            timer = setTimeout(() => stopRegexWorker({
              error: `regular expression stopped after ${REGEX_LIMIT_MS / 1000} s: it would take too long on these ` +
                'texts (nested repetition such as (a+)+ backtracks without end); simplify it',
            }), REGEX_LIMIT_MS);
            return;
          }
          pending.finish({ textHit: data.textHit, own: (i) => data.ownHit[i] === 1 });
        },
      };
      regex.pending = pending;
      regex.worker.postMessage({ id, q, candidates });
    });
  }

  // ------------------------------------------------------------------ filtering

  function indexOfString(value) { const k = stringIndex.get(value); return k === undefined ? -2 : k; }

  async function filtered() {
    const b = state.b ? (benchIndex.has(state.b) ? benchIndex.get(state.b) : -2) : -1;
    const m = state.m ? (modelIndex.has(state.m) ? modelIndex.get(state.m) : -2) : -1;
    const r = state.r ? Number(state.r) : -1;
    const f1 = state.f1 ? indexOfString(state.f1) : -1;
    const f2 = state.f2 ? indexOfString(state.f2) : -1;
    const p = state.p === 'pass' ? 1 : state.p === 'fail' ? 0 : state.p === 'none' ? -1 : 9;
    const s = state.s ? indexOfString(state.s) : -1;
    const ei = state.e ? META.error_types.indexOf(state.e) : -1;
    const e = state.e ? (ei < 0 ? -1 : (1 << Math.min(ei, 30))) : 0;
    let found = null;
    if (searchSaid) searchStatus('');
    if (state.q) {
      found = matcher(state.q, state.re === '1');
      if (found.error) { searchStatus(found.error); return new Int32Array(0); }
      await buildSearch();
    }
    const out = new Int32Array(N);
    let n = 0;
    const X = IX;
    for (let i = 0; i < N; i++) {
      if (b !== -1 && X.b[i] !== b) continue;
      if (m !== -1 && X.m[i] !== m) continue;
      if (r !== -1 && X.r[i] !== r) continue;
      if (f1 !== -1 && X.f1[i] !== f1) continue;
      if (f2 !== -1 && X.f2[i] !== f2) continue;
      if (p !== 9 && X.p[i] !== p) continue;
      if (s !== -1 && X.s[i] !== s) continue;
      if (e !== 0 && (e === -1 || (X.e[i] & e) === 0)) continue;
      out[n++] = i;
    }
    if (!found) return out.slice(0, n);
    const hits = await found.hits(out.subarray(0, n));
    if (hits.stale) return new Int32Array(0); // a later search replaced it (its result is never shown)
    if (hits.error) { searchStatus(hits.error); return new Int32Array(0); }
    let kept = 0;
    for (let k = 0; k < n; k++) {
      const i = out[k];
      let hit = hits.own(i);
      if (!hit) for (const ref of search.refs[i]) if (hits.textHit[ref]) { hit = true; break; }
      if (hit) out[kept++] = i;
    }
    return out.slice(0, kept);
  }
  let searchSaid = false; // the status line says what became of a search
  function searchStatus(text) { setStatus(text); searchSaid = Boolean(text); }

  function sampleKey(i) {
    return { ob: META.benches[IX.b[i]].key, om: META.models[IX.m[i]], or: String(IX.r[i]), ot: S(IX.i[i]) };
  }
  function findSample(ob, om, or, ot) {
    const b = benchIndex.get(ob), m = modelIndex.get(om), r = Number(or), t = stringIndex.get(ot);
    if (b === undefined || m === undefined || t === undefined) return -1;
    for (let i = 0; i < N; i++) if (IX.b[i] === b && IX.m[i] === m && IX.r[i] === r && IX.i[i] === t) return i;
    return -1;
  }

  // ------------------------------------------------------------------ views

  const views = ['overview', 'samples', 'compare'];
  function showView(v) {
    for (const name of views) $(name).hidden = name !== v;
    for (const btn of document.querySelectorAll('#tabs button')) btn.classList.toggle('active', btn.dataset.view === v);
  }

  // ---- overview

  function facetTarget(bench, name) {
    // a figure named like a facet value (a CL-bench category, an ER variation) or an error type links to those samples
    if (META.error_types.includes(name)) return { e: name };
    const b = benchIndex.get(bench.key);
    for (const facet of ['f1', 'f2']) {
      const k = stringIndex.get(name);
      if (k === undefined) continue;
      for (let i = 0; i < N; i++) if (IX.b[i] === b && IX[facet][i] === k) return { [facet]: name };
    }
    return {};
  }
  function goSamples(filters) {
    for (const k of ['b', 'm', 'r', 'f1', 'f2', 'p', 's', 'e', 'q', 're', 'ob', 'om', 'or', 'ot']) state[k] = '';
    Object.assign(state, filters, { v: 'samples' });
    writeHash(true);
    route();
  }
  function interval(f) {
    if (f.items && Array.isArray(f.items.ci95)) {
      // shown within the values the figure can take (rates, F1: [0, 100]); older items: rates only
      const [min, max] = f.items.bounds || (f.items.proportion ? [0, 1] : [null, null]);
      const clip = (x) => Math.min(max ?? Infinity, Math.max(min ?? -Infinity, x));
      return { lo: clip(f.items.ci95[0]), hi: clip(f.items.ci95[1]),
        label: 'item-level 95% CI' + (f.items.ci_method ? ' (' + f.items.ci_method + ')' : '') };
    }
    if (Array.isArray(f.ci95)) return { lo: f.ci95[0], hi: f.ci95[1], label: 'run-level 95% CI (t over runs)' };
    return null;
  }
  function barOf(f, ci) {
    const NS = 'http://www.w3.org/2000/svg', W = 90, H = 9;
    const clamp = (x) => Math.max(0, Math.min(1, Number(x) || 0));
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('class', 'bar'); svg.setAttribute('width', W); svg.setAttribute('height', H);
    const el = (tag, attrs) => { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); svg.append(e); };
    el('rect', { class: 'track', x: 0, y: 1, width: W, height: H - 2 });
    el('rect', { class: 'fill', x: 0, y: 1, width: W * clamp(f.mean), height: H - 2 });
    if (ci) {
      const lo = W * clamp(ci.lo), hi = W * clamp(ci.hi);
      el('line', { class: 'whisker', x1: lo, x2: hi, y1: H / 2, y2: H / 2 });
      el('line', { class: 'whisker', x1: lo, x2: lo, y1: 1, y2: H - 1 });
      el('line', { class: 'whisker', x1: hi, x2: hi, y1: 1, y2: H - 1 });
    }
    return svg;
  }
  function figureTable(bench, models, getFigures, withCost) {
    const names = [];
    for (const m of models) for (const n of Object.keys(getFigures(m) || {})) if (!names.includes(n)) names.push(n);
    if (!names.length) return null;
    const stdKey = 'std_' + (bench.leaderboard.std_shown || 'sample');
    const runsOf = new Map();
    for (const r of bench.runs) {
      const c = runsOf.get(r.model) || { samples: 0, expected: 0, known: true, judged: 0 };
      c.samples += r.samples; c.judged += r.judge_rows;
      if (typeof r.expected === 'number') c.expected += r.expected; else c.known = false;
      runsOf.set(r.model, c);
    }
    const head = h('tr', null, h('th', null, 'Model'), h('th', null, 'Runs'), names.map((n) => h('th', null, n)),
      withCost ? [h('th', { title: 'judge rows / selected tasks, over all runs' }, 'Graded / expected'), h('th', null, 'Cost/run (USD)')] : []);
    const rows = models.map((m) => {
      const figures = getFigures(m) || {};
      const cells = names.map((n) => {
        const f = figures[n];
        if (!f) return h('td', { class: 'num' }, '–');
        const ci = interval(f);
        const spread = typeof f[stdKey] === 'number' ? ' ± ' + pct(f[stdKey]) : '';
        const tip = [
          `${n}: mean ${pct(f.mean)}${spread ? ' ± ' + pct(f[stdKey]) + ' (' + stdKey.replace('_', ' ') + ' over runs)' : ''}`,
          ci ? `${ci.label}: ${pct(ci.lo)} – ${pct(ci.hi)}` : 'no interval (one run)',
          f.items ? `items: ${str(f.items.n_items)}, clusters: ${str(f.items.n_clusters)}, runs per item: ${str(f.items.runs_per_item)}, se: ${pct(f.items.se)} (${str(f.items.se_method)})` : '',
          Array.isArray(f.values) ? 'per run: ' + f.values.map(pct).join(', ') : '',
          'click: the samples behind it',
        ].filter(Boolean).join('\n');
        return h('td', {
          class: 'num link', title: tip, 'data-figure': n,
          onclick: () => goSamples({ b: bench.key, m: m.model, ...facetTarget(bench, n) }),
        }, pct(f.mean) + spread + (m.flagged && n === names[0] ? ' †' : ''),
        ci ? h('div', { class: 'muted' }, '[' + pct(ci.lo) + ', ' + pct(ci.hi) + ']') : null, barOf(f, ci));
      });
      const cov = runsOf.get(m.model);
      const extra = withCost ? [
        h('td', { class: 'num' }, cov ? fmt.format(cov.judged) + ' / ' + (cov.known ? fmt.format(cov.expected) : '?') : '–'),
        h('td', { class: 'num' }, typeof m.cost_usd_per_run === 'number' ? m.cost_usd_per_run.toFixed(4) : '–'),
      ] : [];
      return h('tr', null, h('td', { class: 'link', onclick: () => goSamples({ b: bench.key, m: m.model }) }, m.model),
        h('td', { class: 'num' }, str(m.runs)), cells, extra);
    });
    return h('div', { class: 'scroll' },
      h('table', { class: 'leaderboard', 'data-bench': bench.key }, h('thead', null, head), h('tbody', null, rows)));
  }

  function renderOverview() {
    const root = $('overview');
    if (root.dataset.done) return;
    root.dataset.done = '1';
    const parts = [];
    if (!META.benches.length) parts.push(h('p', null, 'No results found.'));
    for (const bench of META.benches) {
      const lb = bench.leaderboard;
      const sec = h('section', { class: 'bench', 'data-bench': bench.key });
      sec.append(h('h2', null, bench.key));
      const total = bench.runs.reduce((a, r) => a + r.samples, 0);
      sec.append(h('p', null, fmt.format(total) + ' samples in ' + bench.runs.length + ' run(s). ',
        h('span', { class: 'link', onclick: () => goSamples({ b: bench.key }) }, 'Browse them'),
        ' · ', h('span', { class: 'link', onclick: () => goCompare(bench.key) }, 'Compare two models or runs')));
      if (lb.source !== 'aggregate.json') {
        sec.append(h('p', { class: 'muted' }, 'No aggregate.json: figures computed here from score.json (mean ± sample std over runs).'));
      }
      const table = figureTable(bench, lb.models, (m) => m.figures, true);
      if (table) sec.append(h('h3', null, 'Leaderboard (percent; cell: mean ± std over runs, [95% interval], bar with interval)'), table);
      const flagged = lb.models.some((m) => m.flagged);
      if (flagged) sec.append(h('p', { class: 'muted' }, '† flagged by the benchmark (see aggregate.md for why).'));
      const titles = [];
      for (const m of lb.models) for (const t of Object.keys(m.extra_tables || {})) if (!titles.includes(t)) titles.push(t);
      for (const t of titles) {
        const extra = figureTable(bench, lb.models, (m) => (m.extra_tables || {})[t], false);
        if (extra) sec.append(h('h3', null, t), extra);
      }
      for (const note of lb.notes || []) sec.append(h('p', { class: 'muted' }, note));
      if (lb.comparisons && lb.comparisons.length) {
        sec.append(h('h3', null, 'Paired comparisons'));
        const cols = ['model', 'baseline', ...(lb.comparisons.some((c) => c.table) ? ['table'] : []), 'figure', 'diff', 'ci95', 'p_value', 'correlation', 'n_items', 'n_clusters'];
        sec.append(h('table', { class: 'comparisons' }, h('thead', null, h('tr', null, cols.map((c) => h('th', null, c)))),
          h('tbody', null, lb.comparisons.map((c) => h('tr', null, cols.map((col) => {
            let v = c[col];
            if (col === 'diff') v = pct(v);
            else if (col === 'ci95' && Array.isArray(v)) v = '[' + pct(v[0]) + ', ' + pct(v[1]) + ']';
            else if (col === 'p_value' && typeof v === 'number') v = v < 0.001 ? v.toExponential(1) : v.toFixed(3);
            else if (col === 'correlation' && typeof v === 'number') v = v.toFixed(2);
            return h('td', null, str(v));
          }))))));
      }
      // runs: coverage, judge statuses, cost
      const statuses = [];
      for (const r of bench.runs) for (const s of Object.keys(r.statuses)) if (!statuses.includes(s)) statuses.push(s);
      sec.append(h('h3', null, 'Runs: coverage, judge statuses, cost'));
      sec.append(h('table', { class: 'runs' },
        h('thead', null, h('tr', null, ['Model', 'Run', 'Selected', 'Answers', 'Judge rows', 'Passed', ...statuses, 'Cost (USD)'].map((c) => h('th', null, c)))),
        h('tbody', null, bench.runs.map((r) => h('tr', { 'data-model': r.model, 'data-run': String(r.run) },
          h('td', { class: 'link', onclick: () => goSamples({ b: bench.key, m: r.model }) }, r.model),
          h('td', { class: 'num link', onclick: () => goSamples({ b: bench.key, m: r.model, r: String(r.run) }) }, String(r.run)),
          h('td', { class: 'num' }, typeof r.expected === 'number' ? fmt.format(r.expected) : '?'),
          h('td', { class: 'num', 'data-col': 'answers' }, fmt.format(r.infer_rows)),
          h('td', { class: 'num', 'data-col': 'judged' }, fmt.format(r.judge_rows)),
          h('td', { class: 'num link', onclick: () => goSamples({ b: bench.key, m: r.model, r: String(r.run), p: 'pass' }) }, fmt.format(r.passed)),
          statuses.map((s) => h('td', {
            class: 'num link', 'data-status': s,
            onclick: () => goSamples({ b: bench.key, m: r.model, r: String(r.run), s }),
          }, fmt.format(r.statuses[s] || 0))),
          h('td', { class: 'num' }, typeof r.cost_usd === 'number' ? r.cost_usd.toFixed(4) : '–'),
        )))));
      if (bench.plots.length) {
        sec.append(h('h3', null, 'Plots'));
        const box = h('div', { class: 'plots' });
        for (const p of bench.plots) {
          if (typeof p.src !== 'string' || !p.src.startsWith('data:image/png;base64,')) continue;
          const img = h('img', { title: p.name });
          img.alt = bench.key + ' ' + p.name;
          img.className = 'plot';
          img.src = p.src;
          box.append(img);
        }
        sec.append(box);
      }
      const notes = [...(lb.warnings || []), ...bench.problems];
      if (notes.length) {
        sec.append(h('h3', null, 'What is missing or odd (' + notes.length + ')'));
        sec.append(h('ul', { class: 'problems' }, notes.map((p) => h('li', null, p))));
      }
      parts.push(sec);
    }
    root.replaceChildren(...parts);
  }

  // ---- samples

  let list = null, cmpList = null;
  let current = new Int32Array(0);
  let filterToken = 0;

  function options(select, values, chosen, allLabel) {
    const opts = [h('option', { value: '' }, allLabel)];
    for (const [value, label] of values) opts.push(h('option', { value }, label));
    select.replaceChildren(...opts);
    if (chosen && !values.some(([v]) => v === chosen)) select.append(h('option', { value: chosen }, chosen + ' (none)'));
    select.value = chosen;
  }
  function valuesOf(col, b, toLabel) {
    const counts = new Map();
    for (let i = 0; i < N; i++) {
      if (b >= 0 && IX.b[i] !== b) continue;
      const k = IX[col][i];
      counts.set(k, (counts.get(k) || 0) + 1);
    }
    return [...counts.entries()].sort((x, y) => (x[0] - y[0])).map(([k, c]) => toLabel(k, c)).filter(Boolean);
  }

  function buildFilters() {
    const form = $('filters');
    const b = state.b && benchIndex.has(state.b) ? benchIndex.get(state.b) : -1;
    const one = b >= 0 ? b : META.benches.length === 1 ? 0 : -1;
    const facets = one >= 0 ? META.benches[one].facets : ['Category / task / gold', 'Sub-category / variation / prediction'];
    const field = (label, control) => h('label', null, label, control);
    const sel = (name) => h('select', { name, 'aria-label': name });
    const controls = {
      b: sel('b'), m: sel('m'), r: sel('r'), f1: sel('f1'), f2: sel('f2'), p: sel('p'), s: sel('s'), e: sel('e'),
    };
    options(controls.b, META.benches.map((x) => [x.key, x.key]), state.b, 'all benchmarks');
    options(controls.m, valuesOf('m', b, (k, c) => [META.models[k], `${META.models[k]} (${fmt.format(c)})`]), state.m, 'all models');
    options(controls.r, valuesOf('r', b, (k, c) => [String(k), `run ${k} (${fmt.format(c)})`]), state.r, 'all runs');
    const facetValues = (col) => valuesOf(col, b, (k, c) => S(k) === '' ? null : [S(k), `${S(k)} (${fmt.format(c)})`])
      .sort((x, y) => x[0].localeCompare(y[0]));
    options(controls.f1, facetValues('f1'), state.f1, 'all');
    options(controls.f2, facetValues('f2'), state.f2, 'all');
    options(controls.p, [['pass', 'pass'], ['fail', 'fail'], ['none', 'not graded']], state.p, 'pass and fail');
    options(controls.s, valuesOf('s', b, (k, c) => [S(k), `${S(k)} (${fmt.format(c)})`]), state.s, 'all statuses');
    options(controls.e, META.error_types.map((t) => [t, t]), state.e, 'any');
    const q = h('input', { type: 'search', name: 'q', value: state.q, 'aria-label': 'search' });
    q.placeholder = 'search prompt, answer, rationale…';
    const re = h('input', { type: 'checkbox', name: 're', 'aria-label': 'regular expression' });
    re.checked = state.re === '1';
    const reset = h('button', { type: 'button', name: 'reset' }, 'Reset');
    fill(form,
      field('Benchmark', controls.b), field('Model', controls.m), field('Run', controls.r),
      field(facets[0], controls.f1), field(facets[1], controls.f2), field('Pass/fail', controls.p),
      field('Judge / parse status', controls.s),
      META.error_types.length ? field('Error type', controls.e) : null,
      field('Search (/)', q), h('label', { class: 'check' }, re, 'regex'), reset);
    for (const [k, control] of Object.entries(controls)) {
      control.addEventListener('change', () => {
        state[k] = control.value;
        if (k === 'b') { state.f1 = ''; state.f2 = ''; }
        writeHash(false);
        if (k === 'b') buildFilters();
        refresh();
      });
    }
    let timer = 0;
    q.addEventListener('input', () => {
      if (timer) clearTimeout(timer); else busy(1);
      timer = setTimeout(() => { timer = 0; busy(-1); state.q = q.value; writeHash(false); refresh(); }, 200);
    });
    q.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') ev.preventDefault(); });
    re.addEventListener('change', () => { state.re = re.checked ? '1' : ''; writeHash(false); refresh(); });
    reset.addEventListener('click', () => goSamples({}));
  }

  function renderSampleRow(i) {
    const b = META.benches[IX.b[i]];
    return h('div', { role: 'option' },
      h('span', { class: 'c-mark' }, mark(IX.p[i])),
      META.benches.length > 1 && !state.b ? h('span', { class: 'c-f', title: b.key }, b.key) : null,
      h('span', { class: 'c-model', title: META.models[IX.m[i]] }, META.models[IX.m[i]]),
      h('span', { class: 'c-run' }, 'r' + IX.r[i]),
      h('span', { class: 'c-id', title: S(IX.i[i]) }, S(IX.i[i])),
      h('span', { class: 'c-f', title: S(IX.f1[i]) }, S(IX.f1[i])),
      h('span', { class: 'c-f', title: S(IX.f2[i]) }, S(IX.f2[i])),
      h('span', { class: 'c-status' }, S(IX.s[i])),
      h('span', { class: 'c-prev' }, IX.v[i]));
  }

  async function refresh() {
    const token = ++filterToken;
    busy(1);
    try {
      const started = performance.now();
      const items = await filtered();
      if (token !== filterToken) return;
      current = items;
      window.__viewerTimings.last_filter_ms = performance.now() - started;
      $('count').textContent = `${fmt.format(items.length)} of ${fmt.format(N)} samples`;
      list.selected = -1;
      if (state.ot) {
        const i = findSample(state.ob, state.om, state.or, state.ot);
        const pos = i < 0 ? -1 : indexIn(items, i);
        list.setItems(items);
        if (pos >= 0) list.select(pos);
        await showSample(i);
      } else {
        list.setItems(items);
        $('detail').replaceChildren(h('p', { class: 'muted' },
          items.length ? 'Pick a sample (click, or j/k and Enter).' : 'No sample matches these filters.'));
      }
    } finally { busy(-1); }
  }
  function indexIn(items, i) { for (let k = 0; k < items.length; k++) if (items[k] === i) return k; return -1; }

  function openAt(pos, push) {
    if (pos < 0 || pos >= current.length) return;
    const i = current[pos];
    Object.assign(state, sampleKey(i));
    writeHash(push);
    list.select(pos);
    guarded(() => showSample(i));
  }

  // ---- sample detail

  function kv(pairs) {
    const dl = h('dl', { class: 'kv' });
    for (const [k, v] of pairs) if (v !== undefined && v !== null && v !== '') dl.append(h('dt', null, k), h('dd', null, v instanceof Node ? v : str(v)));
    return dl;
  }
  function section(title, ...content) { return [h('h3', null, title), ...content.flat(Infinity).filter((x) => x)]; }
  function fill(el, ...kids) { el.replaceChildren(...kids.flat(Infinity).filter((x) => x !== null && x !== undefined && x !== false)); }

  const OPEN_CHARS = 2000; // a longer message (a context) starts collapsed
  function messageView(msg, d) {
    const [role, ref] = msg;
    const long = typeof ref === 'number';
    if (!long) return h('div', { class: 'msg' }, h('div', { class: 'role' }, role), pre(ref));
    const full = META.text_chars[ref];
    const cut = META.cut.cap !== null && full > META.cut.cap;
    const first = d.messages && d.messages[0] === msg;
    const ctx = first && d.metadata && d.metadata.context_id ? ' · context ' + str(d.metadata.context_id) : '';
    const body = pre('loading…');
    const box = h('details', { class: 'msg' },
      h('summary', null, role + ' · ' + fmt.format(full) + ' characters' + (cut ? ' (cut to ' + fmt.format(META.cut.cap) + ' in this report)' : '') + ctx),
      body);
    const load = () => {
      if (!box.dataset.loaded) {
        box.dataset.loaded = '1';
        guarded(async () => { body.textContent = await textOf(ref); });
      }
    };
    box.addEventListener('toggle', () => { if (box.open) load(); });
    if (full <= OPEN_CHARS) { box.open = true; load(); } // short enough to read at once
    return box;
  }
  // a reasoning model's thinking: folded above the answer, loaded when opened
  function thinkingView(d) {
    const ranOut = d.status === 'thinking_truncated';
    if (d.thinking === undefined) {
      return ranOut ? [h('p', { class: 'muted thinking' }, 'Ran out of tokens while thinking: no final answer (the thinking was not handed back).')] : [];
    }
    const ref = d.thinking;
    const full = typeof ref === 'number' ? META.text_chars[ref] : ref.length;
    const body = pre('loading…');
    const box = h('details', { class: 'msg thinking' },
      h('summary', null, 'Thinking · ' + fmt.format(full) + ' characters' + (ranOut ? ' · ran out of tokens while thinking: no final answer' : '')),
      body);
    box.addEventListener('toggle', () => {
      if (box.open && !box.dataset.loaded) {
        box.dataset.loaded = '1';
        guarded(async () => { body.textContent = await textOf(ref); });
      }
    });
    return [box];
  }
  function conversation(d, title) {
    if (d.slim) return section(title, h('p', { class: 'muted' }, 'Not in the rows: written with --slim (python -m evalpipe.expand joins the messages back).'));
    if (!d.messages || !d.messages.length) return [];
    return section(title, d.messages.map((msg) => messageView(msg, d)));
  }
  function judgeBlock(d) {
    const out = [];
    if (d.rationale !== undefined) out.push(...section('Judge rationale', pre(d.rationale)));
    const facts = kv([['status', d.judge_status], ['salvaged from', d.judge_salvage], ['notes', d.judge_notes],
      ['error', d.judge_error], ['judge model', d.judge_model], ['attempts', d.judge_attempts]]);
    if (facts.childNodes.length) out.push(...section('Judge', facts));
    return out;
  }
  function rubricBlock(d) {
    if (!d.rubrics) return [];
    const st = Array.isArray(d.requirement_status) ? d.requirement_status : [];
    const items = d.rubrics.map((r, k) => {
      const v = st[k];
      const verdict = v === 'yes' ? h('span', { class: 'verdict pass' }, 'yes') : v === 'no' ? h('span', { class: 'verdict fail' }, 'no')
        : h('span', { class: 'verdict none' }, v === undefined ? '?' : str(v));
      return h('li', null, verdict, str(r));
    });
    const note = st.length && st.length !== d.rubrics.length
      ? h('p', { class: 'problem' }, `${st.length} statuses for ${d.rubrics.length} rubrics`) : null;
    return section('Rubrics and the judge\'s verdicts', h('ol', { class: 'rubrics' }, items), note);
  }
  function analysisBlock(d) {
    if (!d.analysis) return [];
    const a = d.analysis;
    return section('Error analysis', kv([['types', (a.error_types || []).map(str).join(', ')], ['reason', a.error_reason],
      ['status', a.analysis_status], ['error', a.analysis_error], ['model', a.analysis_model]]));
  }
  function inferBlock(d) {
    return section('Call', kv([['infer status', d.status], ['infer error', d.error], ['finish reason', d.finish_reason],
      ['usage', d.usage], ['latency (s)', d.latency_s], ['calls', d.calls], ['judge usage', d.judge_usage],
      ['judge latency (s)', d.judge_latency_s], ['metadata', d.metadata], ['other fields', d.extra]]));
  }

  async function siblings(i) {
    const out = [];
    for (let k = 0; k < N; k++) {
      if (IX.b[k] === IX.b[i] && IX.m[k] === IX.m[i] && IX.r[k] === IX.r[i] && IX.g[k] === IX.g[i]) out.push(k);
    }
    const order = { NR: 0, CR: 1, IR: 2 };
    out.sort((x, y) => (order[S(IX.f2[x])] ?? 9) - (order[S(IX.f2[y])] ?? 9));
    return Promise.all(out.map(async (k) => [k, await detailOf(k)]));
  }

  async function sampleBody(i, d, compact) {
    const kind = META.benches[IX.b[i]].kind;
    const parts = [];
    if (kind === 'coin_flip') {
      if (d.question !== undefined) parts.push(...section('Question', pre(d.question)));
      parts.push(h('table', { class: 'cf' }, h('tr', null, ['Gold', 'Prediction', 'Correct', 'Parse mode'].map((c) => h('th', null, c))),
        h('tr', null, h('td', null, str(d.target)), h('td', null, d.prediction === null ? 'unparsed' : str(d.prediction)),
          h('td', null, mark(IX.p[i])), h('td', null, str(d.parse_mode)))));
      parts.push(...section('Raw reply', thinkingView(d), pre(d.output)));
      if (!compact) parts.push(...conversation(d, 'Prompt as sent'));
    } else if (kind === 'error_recovery') {
      if (!compact && d.question !== undefined) parts.push(...section('Problem', pre(d.question)));
      if (d.given !== undefined) {
        const at = typeof d.mistake_at === 'number' ? d.mistake_at : -1;
        const box = h('pre', { class: 'text' });
        if (at >= 0) box.append(d.given.slice(0, at), h('mark', { title: 'the mistaken step' }, d.given.slice(at)));
        else box.append(d.given);
        parts.push(...section('Given reasoning' + (at >= 0 ? ' (the mistaken step marked)' : ''), box));
      }
      if (compact) {
        parts.push(...section('Answer', thinkingView(d), kv([['extracted', d.answer], ['target', d.target], ['exact', str(d.correct)],
          ['normalised', str(d.normalized_correct)]]), h('div', { class: 'role' }, 'model reasoning'), pre(d.output)));
      } else {
        const sibs = await siblings(i);
        parts.push(...section('NR, CR and IR side by side (this model and run)', h('div', { class: 'cols' }, sibs.map(([k, s]) =>
          h('div', { 'data-variation': S(IX.f2[k]) }, h('strong', null, S(IX.f2[k]) + ' '), mark(IX.p[k]),
            kv([['extracted answer', s.answer], ['target', s.target], ['exact match', str(s.correct)], ['normalised', str(s.normalized_correct)]]),
            h('div', { class: 'role' }, 'model reasoning'), pre(s.output)),
        ))));
        parts.push(...section('Model reasoning (this sample)', thinkingView(d), pre(d.output)));
        parts.push(...conversation(d, 'Conversation as sent'));
      }
    } else {
      if (!compact) parts.push(...conversation(d, 'Conversation'));
      parts.push(...section('Answer', thinkingView(d), pre(d.output)));
      parts.push(...rubricBlock(d));
    }
    parts.push(...judgeBlock(d), ...analysisBlock(d));
    if (!compact) parts.push(...inferBlock(d));
    return parts;
  }

  async function showSample(i) {
    const box = $('detail');
    if (i < 0) {
      box.replaceChildren(h('p', { class: 'problem' }, 'The linked sample is not in this report.'));
      return;
    }
    const d = await detailOf(i);
    const b = META.benches[IX.b[i]];
    const pos = indexIn(current, i);
    const linkBox = h('input', { type: 'text', readonly: true, class: 'linkbox', hidden: true, 'aria-label': 'permalink' });
    const head = h('div', { class: 'head' },
      h('strong', { 'data-sample': S(IX.i[i]) }, b.key + ' · ' + META.models[IX.m[i]] + ' · run ' + IX.r[i] + ' · ' + S(IX.i[i])),
      mark(IX.p[i]), h('span', { class: 'badge' }, S(IX.s[i])),
      h('button', { type: 'button', onclick: () => openAt(pos - 1, true), title: 'previous (k)' }, '↑'),
      h('button', { type: 'button', onclick: () => openAt(pos + 1, true), title: 'next (j)' }, '↓'),
      h('button', { type: 'button', onclick: () => { linkBox.hidden = !linkBox.hidden; linkBox.value = location.href; linkBox.select(); } }, 'Link'),
      h('button', { type: 'button', onclick: closeSample, title: 'close (Esc)' }, '✕'), linkBox);
    const facts = kv([[b.facets[0], S(IX.f1[i])], [b.facets[1], S(IX.f2[i])], ['task id', S(IX.i[i])],
      ['context id', d.metadata && d.metadata.context_id]]);
    fill(box, head, facts, await sampleBody(i, d, false));
    box.scrollTop = 0;
  }
  function closeSample() {
    state.ob = state.om = state.or = state.ot = '';
    writeHash(true);
    list.selected = -1;
    list.render();
    $('detail').replaceChildren(h('p', { class: 'muted' }, 'Pick a sample (click, or j/k and Enter).'));
  }

  // ---- compare

  function goCompare(benchKey) {
    state.v = 'compare';
    if (benchKey) { state.cb = benchKey; state.am = state.ar = state.bm = state.br = state.ct = ''; }
    writeHash(true);
    route();
  }
  function combos(b) {
    const seen = new Map();
    for (let i = 0; i < N; i++) if (IX.b[i] === b) seen.set(IX.m[i] * 100000 + IX.r[i], [IX.m[i], IX.r[i]]);
    return [...seen.values()].sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  }
  function defaults(b) {
    const c = combos(b);
    const models = [...new Set(c.map((x) => x[0]))];
    if (models.length >= 2) return [META.models[models[0]], '', META.models[models[1]], ''];
    if (c.length >= 2) return [META.models[c[0][0]], String(c[0][1]), META.models[c[1][0]], String(c[1][1])];
    if (c.length === 1) return [META.models[c[0][0]], String(c[0][1]), META.models[c[0][0]], String(c[0][1])];
    return ['', '', '', ''];
  }
  let cmpRows = [];
  function buildCompareForm() {
    const form = $('cmpform');
    if (!state.cb || !benchIndex.has(state.cb)) state.cb = META.benches.length ? META.benches[0].key : '';
    const b = benchIndex.has(state.cb) ? benchIndex.get(state.cb) : -1;
    if (b >= 0 && !state.am && !state.bm) [state.am, state.ar, state.bm, state.br] = defaults(b);
    const c = b >= 0 ? combos(b) : [];
    const models = [...new Set(c.map((x) => META.models[x[0]]))];
    const runsOf = (model) => c.filter((x) => META.models[x[0]] === model).map((x) => [String(x[1]), 'run ' + x[1]]);
    const sel = (name, values, all) => { const s = h('select', { name, 'aria-label': name }); options(s, values, state[name], all); return s; };
    const controls = {
      cb: sel('cb', META.benches.map((x) => [x.key, x.key]), 'choose'),
      am: sel('am', models.map((m) => [m, m]), 'choose'), ar: sel('ar', runsOf(state.am), 'all runs'),
      bm: sel('bm', models.map((m) => [m, m]), 'choose'), br: sel('br', runsOf(state.bm), 'all runs'),
      cf: sel('cf', [['disagree', 'they disagree'], ['a', 'only A passes'], ['b', 'only B passes'], ['both', 'both pass'],
        ['neither', 'both fail'], ['one', 'graded on one side only']], 'all shared tasks'),
    };
    const field = (label, control) => h('label', null, label, control);
    form.replaceChildren(field('Benchmark', controls.cb), field('A: model', controls.am), field('A: run', controls.ar),
      field('B: model', controls.bm), field('B: run', controls.br), field('Show', controls.cf));
    for (const [k, control] of Object.entries(controls)) {
      control.addEventListener('change', () => {
        state[k] = control.value;
        if (k === 'cb') state.am = state.ar = state.bm = state.br = '';
        if (k === 'am') state.ar = '';
        if (k === 'bm') state.br = '';
        state.ct = '';
        writeHash(false);
        renderCompare();
      });
    }
  }
  function side(b, model, run) {
    const m = modelIndex.has(model) ? modelIndex.get(model) : -2;
    const r = run ? Number(run) : -1;
    const per = new Map(); // task string index -> {pass, graded, samples: []}
    for (let i = 0; i < N; i++) {
      if (IX.b[i] !== b || IX.m[i] !== m || (r !== -1 && IX.r[i] !== r)) continue;
      const t = IX.i[i];
      let e = per.get(t);
      if (!e) per.set(t, e = { pass: 0, graded: 0, samples: [] });
      e.samples.push(i);
      if (IX.p[i] >= 0) { e.graded++; e.pass += IX.p[i]; }
    }
    return per;
  }
  function renderCompare() {
    buildCompareForm();
    const b = benchIndex.has(state.cb) ? benchIndex.get(state.cb) : -1;
    if (b < 0) { $('cmpsummary').replaceChildren('No benchmark.'); cmpList.setItems(new Int32Array(0)); return; }
    const A = side(b, state.am, state.ar), B = side(b, state.bm, state.br);
    const tasks = new Set([...A.keys(), ...B.keys()]);
    const counts = { disagree: 0, a: 0, b: 0, both: 0, neither: 0, one: 0 };
    const rows = [];
    for (const t of tasks) {
      const a = A.get(t), bb = B.get(t);
      const ra = a && a.graded ? a.pass / a.graded : null, rb = bb && bb.graded ? bb.pass / bb.graded : null;
      let kind;
      if (ra === null || rb === null) kind = 'one';
      else if (ra === rb) kind = ra === 1 ? 'both' : ra === 0 ? 'neither' : 'same';
      else kind = 'disagree';
      if (kind === 'disagree') { counts.disagree++; if (ra > rb) counts.a += (ra === 1 && rb === 0) ? 1 : 0; else counts.b += (rb === 1 && ra === 0) ? 1 : 0; }
      else if (counts[kind] !== undefined) counts[kind]++;
      rows.push({ t, a, b: bb, ra, rb, kind, gap: ra === null || rb === null ? -1 : Math.abs(ra - rb) });
    }
    const order = (x) => x.kind === 'disagree' ? 0 : x.kind === 'one' ? 2 : 1;
    rows.sort((x, y) => order(x) - order(y) || y.gap - x.gap || x.t - y.t);
    const want = state.cf;
    cmpRows = rows.filter((x) => !want || (want === 'disagree' ? x.kind === 'disagree'
      : want === 'a' ? x.ra === 1 && x.rb === 0 : want === 'b' ? x.rb === 1 && x.ra === 0
        : want === 'one' ? x.kind === 'one' : x.kind === want));
    const label = (m, r) => (m || '?') + (r ? ' run ' + r : ' (all runs)');
    const pick = (cf) => () => { state.cf = cf; state.ct = ''; writeHash(false); renderCompare(); };
    $('cmpsummary').replaceChildren(
      h('span', null, 'A = ', h('strong', null, label(state.am, state.ar)), ', B = ', h('strong', null, label(state.bm, state.br)),
        ' · ' + fmt.format(tasks.size) + ' tasks'),
      h('span', { class: 'link', 'data-count': 'disagree', onclick: pick('disagree') }, 'disagree: ' + fmt.format(counts.disagree)),
      h('span', { class: 'link', 'data-count': 'a', onclick: pick('a') }, 'A passes, B fails: ' + fmt.format(counts.a)),
      h('span', { class: 'link', 'data-count': 'b', onclick: pick('b') }, 'B passes, A fails: ' + fmt.format(counts.b)),
      h('span', { class: 'link', 'data-count': 'both', onclick: pick('both') }, 'both pass: ' + fmt.format(counts.both)),
      h('span', { class: 'link', 'data-count': 'neither', onclick: pick('neither') }, 'both fail: ' + fmt.format(counts.neither)),
      h('span', { class: 'link', 'data-count': 'one', onclick: pick('one') }, 'graded on one side only: ' + fmt.format(counts.one)));
    $('cmpcount').textContent = fmt.format(cmpRows.length) + ' tasks listed, disagreements first';
    cmpList.selected = -1;
    cmpList.setItems(Int32Array.from(cmpRows.keys()));
    const at = state.ct ? cmpRows.findIndex((x) => S(x.t) === state.ct) : -1;
    if (at >= 0) { cmpList.select(at); guarded(() => showPair(at)); }
    else $('cmpdetail').replaceChildren(h('p', { class: 'muted' }, cmpRows.length ? 'Pick a task to see both sides.' : 'No task to show.'));
  }
  function rate(side_, r) {
    if (!side_) return h('span', { class: 'none', title: 'no row' }, '·');
    if (side_.samples.length === 1) return mark(IX.p[side_.samples[0]]);
    const cls = r === null ? 'none' : r === 1 ? 'pass' : r === 0 ? 'fail' : '';
    return h('span', { class: cls }, side_.pass + '/' + side_.samples.length);
  }
  function renderCmpRow(k) {
    const x = cmpRows[k];
    const first = (x.a || x.b).samples[0];
    return h('div', { role: 'option', 'data-kind': x.kind },
      h('span', { class: 'c-ab', title: 'A' }, rate(x.a, x.ra)), h('span', { class: 'c-ab', title: 'B' }, rate(x.b, x.rb)),
      h('span', { class: 'c-id', title: S(x.t) }, S(x.t)), h('span', { class: 'c-f' }, S(IX.f1[first])),
      h('span', { class: 'c-f' }, S(IX.f2[first])), h('span', { class: 'c-prev' }, x.kind));
  }
  async function showPair(k) {
    const x = cmpRows[k];
    const column = async (title, s) => {
      const col = h('div', null, h('h3', null, title));
      if (!s) { col.append(h('p', { class: 'muted' }, 'No row for this task.')); return col; }
      for (const i of s.samples) {
        const d = await detailOf(i);
        col.append(h('p', null, h('strong', null, META.models[IX.m[i]] + ' run ' + IX.r[i] + ' '), mark(IX.p[i]), ' ',
          h('span', { class: 'badge' }, S(IX.s[i])), ' ',
          h('span', { class: 'link', onclick: () => goSamples({ ...sampleKey(i), b: META.benches[IX.b[i]].key }) }, 'open')),
        ...(await sampleBody(i, d, true)).filter((x) => x));
      }
      return col;
    };
    const first = (x.a || x.b).samples[0];
    const d = await detailOf(first);
    const kind = META.benches[IX.b[first]].kind;
    const shared = [];
    if (kind === 'coin_flip' || kind === 'error_recovery') {
      if (d.question !== undefined) shared.push(...section(kind === 'coin_flip' ? 'Question' : 'Problem', pre(d.question)));
    } else shared.push(...conversation(d, 'Conversation (A\'s first row)'));
    fill($('cmpdetail'), h('div', { class: 'head' }, h('strong', null, S(x.t)), h('span', { class: 'badge' }, x.kind)),
      shared, h('div', { class: 'cols' }, await column('A: ' + state.am, x.a), await column('B: ' + state.bm, x.b)));
    $('cmpdetail').scrollTop = 0;
  }

  // ------------------------------------------------------------------ routing and keys

  async function route() {
    showView(state.v);
    if (state.v === 'overview') renderOverview();
    else if (state.v === 'samples') {
      buildFilters();
      await refresh();
    } else renderCompare();
  }
  function onHash() {
    if (writingHash) { writingHash = false; return; }
    readHash();
    guarded(route);
  }

  function keys(ev) {
    const typing = ev.target instanceof HTMLInputElement || ev.target instanceof HTMLSelectElement;
    if (ev.key === '/' && !typing && state.v === 'samples') {
      ev.preventDefault();
      const q = document.querySelector('#filters input[name=q]');
      if (q) q.focus();
      return;
    }
    if (typing) return;
    const active = state.v === 'samples' ? list : state.v === 'compare' ? cmpList : null;
    if (!active) return;
    if (ev.key === 'j' || ev.key === 'ArrowDown' || ev.key === 'k' || ev.key === 'ArrowUp') {
      ev.preventDefault();
      const step = (ev.key === 'j' || ev.key === 'ArrowDown') ? 1 : -1;
      const pos = Math.max(0, Math.min(active.items.length - 1, active.selected + step));
      active.onPick(pos);
    } else if (ev.key === 'Escape' && active === list) closeSample();
  }

  async function start() {
    $('source').textContent = META.source + ' · ' + META.generator;
    if (META.cut.texts_cut) {
      const c = META.cut;
      const banner = $('banner');
      banner.hidden = false;
      banner.textContent = `Long prompt texts are cut to ${fmt.format(c.cap)} characters (head and tail): ${fmt.format(c.texts_cut)} of ` +
        `${fmt.format(c.texts)} texts, ${fmt.format(c.chars_omitted)} of ${fmt.format(c.chars_total)} characters not embedded. ` +
        'Regenerate with --context-chars all to embed everything.';
    }
    for (const btn of document.querySelectorAll('#tabs button')) {
      btn.addEventListener('click', () => {
        state.v = btn.dataset.view;
        writeHash(true);
        guarded(route);
      });
    }
    setStatus('loading ' + fmt.format(META.samples) + ' samples…');
    await loadIndex();
    window.__viewerTimings.index_ms = performance.now() - t0;
    setStatus('');
    list = new VList($('list'), 28, renderSampleRow, (pos) => openAt(pos, true));
    cmpList = new VList($('cmplist'), 28, renderCmpRow, (pos) => {
      cmpList.select(pos);
      state.ct = S(cmpRows[pos].t);
      writeHash(true);
      guarded(() => showPair(pos));
    });
    window.addEventListener('hashchange', onHash);
    window.addEventListener('popstate', onHash);
    document.addEventListener('keydown', keys);
    readHash();
    await route();
    window.__viewerTimings.ready_ms = performance.now() - t0;
    window.__viewer = { count: () => current.length, state, timings: window.__viewerTimings };
    window.__viewerReady = true;
  }
  guarded(start);
})();
