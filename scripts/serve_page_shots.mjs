// Screenshots of `difftx serve`'s page (GET /) in headless Chromium, driven over the DevTools
// protocol with Node's own WebSocket (no npm packages). Not part of CI.
//
//   difftx serve --model MODEL --port 18190 &
//   node --experimental-websocket scripts/serve_page_shots.mjs http://127.0.0.1:18190 /tmp/shots
//
// Opens the page with query parameters that fill the forms and run both panels (a streamed
// greedy completion with presence and frequency penalties, checked against the API's text for
// the same fields, and the attention maps of layer 1, head 0), waits until both are done,
// prints the page's console errors, and writes page.png, playground.png, explorer.png and
// explorer-mean.png (the layer's heads averaged).
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [base, outDir] = process.argv.slice(2);
if (!base || !outDir) {
  console.error("usage: serve_page_shots.mjs BASE_URL OUT_DIR");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });
const port = 9300 + Math.floor(Math.random() * 500);
const chrome = spawn(process.env.CHROMIUM || "/usr/bin/chromium", [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run",
  `--user-data-dir=${mkdtempSync(join(tmpdir(), "shots-"))}`,
  `--remote-debugging-port=${port}`, "--window-size=1500,1100", "about:blank",
], { stdio: ["ignore", "ignore", "pipe"] });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function target() {
  for (let i = 0; i < 100; i++) {
    try {
      const list = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
      const page = list.find((t) => t.type === "page");
      if (page) return page.webSocketDebuggerUrl;
    } catch (_) { /* not up yet */ }
    await sleep(200);
  }
  throw new Error("chromium did not open its DevTools port");
}

const ws = new WebSocket(await target());
await new Promise((r, e) => { ws.onopen = r; ws.onerror = e; });
let next = 0;
const waiting = new Map();
const problems = [];
ws.onmessage = (m) => {
  const v = JSON.parse(m.data);
  if (v.id !== undefined && waiting.has(v.id)) {
    const { ok, fail } = waiting.get(v.id);
    waiting.delete(v.id);
    v.error ? fail(new Error(JSON.stringify(v.error))) : ok(v.result);
  } else if (v.method === "Runtime.exceptionThrown") {
    problems.push(v.params.exceptionDetails.exception?.description || v.params.exceptionDetails.text);
  } else if (v.method === "Runtime.consoleAPICalled" && v.params.type === "error") {
    problems.push(v.params.args.map((a) => a.value ?? a.description).join(" "));
  }
};
const send = (method, params = {}) => new Promise((ok, fail) => {
  const id = ++next;
  waiting.set(id, { ok, fail });
  ws.send(JSON.stringify({ id, method, params }));
});
const evaluate = async (expr) => (await send("Runtime.evaluate", { expression: expr, returnByValue: true })).result.value;

async function shot(file, selector) {
  let clip;
  if (selector) {
    const r = await evaluate(`(() => { const b = document.querySelector(${JSON.stringify(selector)}).getBoundingClientRect();
      return { x: b.x + scrollX, y: b.y + scrollY, width: b.width, height: b.height }; })()`);
    clip = { ...r, scale: 1 };
  }
  const png = await send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true, ...(clip ? { clip } : {}) });
  writeFileSync(join(outDir, file), Buffer.from(png.data, "base64"));
  console.log(`wrote ${join(outDir, file)}`);
}

try {
  await send("Page.enable");
  await send("Runtime.enable");
  await send("Emulation.setDeviceMetricsOverride", { width: 1500, height: 1100, deviceScaleFactor: 1, mobile: false });
  const q = new URLSearchParams({
    prompt: "The differential transformer", max_tokens: "48", temperature: "0", run: "1",
    presence_penalty: "0.5", frequency_penalty: "1.5",
    map_prompt: "The cat sat on the mat. The cat", layer: "1", head: "0", explore: "1",
  });
  await send("Page.navigate", { url: `${base}/?${q}` });
  const t0 = Date.now();
  while ((await evaluate("document.body && document.body.dataset.generated === '1' && document.body.dataset.mapped === '1'")) !== true) {
    if (Date.now() - t0 > 120000) throw new Error("the page did not finish both panels in 120 s");
    await sleep(250);
  }
  await sleep(300);
  console.log("playground status:", await evaluate("document.getElementById('gen_status').textContent"));
  console.log("explorer status:", await evaluate("document.getElementById('map_status').textContent"));
  console.log("canvases:", await evaluate("document.querySelectorAll('#maps canvas').length"));
  // the page sent the penalties: its greedy text is the API's for the same fields
  const shown = await evaluate("document.getElementById('output').textContent");
  const api = await (await fetch(`${base}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: q.get("prompt"), max_tokens: 48, temperature: 0,
      presence_penalty: 0.5, frequency_penalty: 1.5 }),
  })).json();
  const same = shown === q.get("prompt") + api.choices[0].text;
  console.log("playground text equals the API's with the same penalties:", same);
  if (!same) problems.push(`page text ${JSON.stringify(shown)} != API ${JSON.stringify(api.choices[0].text)}`);
  await shot("page.png");
  await shot("playground.png", "#playground");
  await shot("explorer.png", "#explorer");
  // every head of the layer averaged
  await evaluate("document.getElementById('head').value = 'mean'; drawHead()");
  await sleep(200);
  console.log("explorer status (mean):", await evaluate("document.getElementById('map_status').textContent"));
  console.log("mean titles:", await evaluate("[...document.querySelectorAll('#maps h3')].map((h) => h.textContent).join(' | ')"));
  await shot("explorer-mean.png", "#explorer");
  if (process.env.ZOOM) { await send("Emulation.setDeviceMetricsOverride", { width: 1500, height: 1100, deviceScaleFactor: 2, mobile: false }); await evaluate("drawHead()"); await shot("maps-zoom.png", "#maps canvas"); }
  if (problems.length) console.log("page errors:\n" + problems.join("\n"));
  else console.log("page errors: none");
} finally {
  ws.close();
  chrome.kill();
}
