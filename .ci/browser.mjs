// Serves a built page on 127.0.0.1, opens it in headless Chromium over the DevTools
// protocol, waits for the page to publish its report, saves it and a screenshot, prints
// one line per row and `N passed, N failed` last. Exits non-zero on a failed row, a page
// without a WebGPU adapter, a page error, or a timeout.
//
// The protocol runs over a pipe (--remote-debugging-pipe: fds 3 and 4, NUL-terminated
// JSON), so no debugging port is opened and no WebSocket library is needed.
//
// Usage: node browser.mjs ROOT OUT [TIMEOUT_S]
//   ROOT  the folder holding index.html and the wasm-bindgen output
//   OUT   where report.json, page.png and console.log go
// CHROMIUM names the browser binary (default: chromium-headless-shell).

import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { extname, join, normalize, resolve, sep } from 'node:path';

const [root, out, timeoutArg] = process.argv.slice(2);
if (!root || !out) {
  console.error('usage: node browser.mjs ROOT OUT [TIMEOUT_S]');
  process.exit(2);
}
const timeoutMs = Number(timeoutArg ?? 600) * 1000;
const chromium = process.env.CHROMIUM ?? 'chromium-headless-shell';
// SwiftShader's Vulkan driver is the adapter on a machine without a GPU; on one with a GPU
// Chromium would still pick SwiftShader with these flags, which keeps CI's result stable.
const flags = [
  '--headless',
  '--no-sandbox',
  '--enable-unsafe-webgpu',
  '--enable-features=Vulkan',
  '--use-webgpu-adapter=swiftshader',
  '--no-first-run',
  '--no-default-browser-check',
  '--disable-extensions',
  '--window-size=1200,900',
  '--remote-debugging-pipe',
];

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.wasm': 'application/wasm',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
};

/** A static file server for `dir` on a free loopback port. */
function serve(dir) {
  const base = resolve(dir);
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    const file = normalize(join(base, path.endsWith('/') ? path + 'index.html' : path));
    if (!file.startsWith(base + sep)) {
      res.writeHead(403).end();
      return;
    }
    try {
      const body = readFileSync(file);
      res.writeHead(200, { 'content-type': MIME[extname(file)] ?? 'application/octet-stream' });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok(server)));
}

/** The DevTools protocol over Chromium's pipe: `send` resolves with a command's result. */
function devtools(proc, onEvent) {
  const pending = new Map();
  let nextId = 1;
  let buffered = '';
  let closed = false;
  // A browser that exits (after `Browser.close`, say) may not answer what is pending: fail
  // those calls rather than wait for ever (a CI run once hung here, the page passed).
  proc.stdio[4].on('close', () => {
    closed = true;
    for (const { fail } of pending.values()) fail(new Error('the browser closed its pipe'));
    pending.clear();
  });
  proc.stdio[4].on('data', (chunk) => {
    buffered += chunk.toString('utf8');
    let end;
    while ((end = buffered.indexOf('\0')) >= 0) {
      const msg = JSON.parse(buffered.slice(0, end));
      buffered = buffered.slice(end + 1);
      if (msg.id && pending.has(msg.id)) {
        const { ok, fail } = pending.get(msg.id);
        pending.delete(msg.id);
        msg.error ? fail(new Error(`${msg.error.message} (${msg.error.code})`)) : ok(msg.result);
      } else if (msg.method) {
        onEvent(msg);
      }
    }
  });
  return (method, params = {}, sessionId) =>
    new Promise((ok, fail) => {
      if (closed) {
        fail(new Error('the browser closed its pipe'));
        return;
      }
      const id = nextId++;
      pending.set(id, { ok, fail });
      proc.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + '\0');
    });
}

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

/** Prints the report's rows and the summary; returns the exit status. */
function summarize(report, problem) {
  let passed = 0;
  let failed = 0;
  if (report?.adapter) console.log(`adapter: ${report.adapter}`);
  for (const row of report?.rows ?? []) {
    const verdict = row.pass ? 'pass' : 'FAIL';
    console.log(
      `${verdict}  ${row.kernel.padEnd(34)} ${row.shape.padEnd(28)} ` +
        `${row.output} ${row.error.toExponential(2)} <= ${row.bound.toExponential(2)}  ` +
        `${row.ms.toFixed(1)} ms`,
    );
    row.pass ? passed++ : failed++;
  }
  const why = problem ?? report?.error;
  if (why) {
    console.log(`FAIL  ${why}`);
    failed++;
  } else if (passed + failed === 0) {
    console.log('FAIL  the page reported no rows');
    failed++;
  }
  console.log(`${passed} passed, ${failed} failed`);
  return failed === 0 ? 0 : 1;
}

async function main() {
  mkdirSync(out, { recursive: true });
  const server = await serve(root);
  const url = `http://127.0.0.1:${server.address().port}/`;
  const proc = spawn(chromium, [...flags, 'about:blank'], {
    stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'],
  });
  const log = [];
  proc.stderr.on('data', (d) => log.push(`[chromium] ${d.toString().trimEnd()}`));
  proc.stdio[3].on('error', () => {}); // a write after the browser exited
  const exited = new Promise((ok) => proc.on('exit', (code) => ok(code)));
  // Never leave the browser behind: not when this driver is stopped, nor when the browser
  // stops answering (the page's own deadline only covers waiting for its report).
  const abandon = (why) => {
    proc.kill('SIGKILL');
    console.log(`FAIL  ${why}`);
    console.log('0 passed, 1 failed');
    process.exit(1);
  };
  for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => abandon(`stopped by ${signal}`));
  setTimeout(() => abandon('the browser stopped answering'), timeoutMs + 120_000).unref();
  const send = devtools(proc, (msg) => {
    if (msg.method === 'Runtime.consoleAPICalled') {
      const text = msg.params.args.map((a) => a.value ?? a.description ?? '').join(' ');
      log.push(`[console.${msg.params.type}] ${text}`);
    } else if (msg.method === 'Runtime.exceptionThrown') {
      const d = msg.params.exceptionDetails;
      log.push(`[exception] ${d.exception?.description ?? d.text}`);
    }
  });
  let report = null;
  let problem = null;
  try {
    const { targetInfos } = await send('Target.getTargets');
    const page = targetInfos.find((t) => t.type === 'page');
    const { sessionId } = await send('Target.attachToTarget', {
      targetId: page.targetId,
      flatten: true,
    });
    const call = (method, params) => send(method, params, sessionId);
    await call('Runtime.enable');
    await call('Page.enable');
    await call('Page.navigate', { url });
    const deadline = Date.now() + timeoutMs;
    const evaluate = async (expression) =>
      (await call('Runtime.evaluate', { expression, returnByValue: true })).result.value;
    while (!(await evaluate('window.attnReport !== undefined'))) {
      if (Date.now() > deadline) {
        problem = `timed out after ${timeoutMs / 1000} s waiting for the page's report`;
        break;
      }
      await sleep(500);
    }
    if (!problem) report = JSON.parse(await evaluate('JSON.stringify(window.attnReport)'));
    // The whole page and no more, however tall the table grew.
    const height = await evaluate('Math.ceil(document.body.getBoundingClientRect().bottom) + 24');
    await call('Emulation.setDeviceMetricsOverride', {
      width: 1200,
      height: Math.min(Math.max(height, 200), 8000),
      deviceScaleFactor: 1,
      mobile: false,
    });
    const shot = await call('Page.captureScreenshot', { format: 'png' });
    writeFileSync(join(out, 'page.png'), Buffer.from(shot.data, 'base64'));
    await Promise.race([send('Browser.close').catch(() => {}), exited, sleep(10_000)]);
  } catch (e) {
    problem = `driving the browser failed: ${e.message}`;
  } finally {
    server.close();
    const killed = setTimeout(() => proc.kill('SIGKILL'), 5000);
    proc.kill();
    await Promise.race([exited, sleep(6000)]);
    clearTimeout(killed);
  }
  writeFileSync(join(out, 'console.log'), log.join('\n') + '\n');
  if (report) writeFileSync(join(out, 'report.json'), JSON.stringify(report, null, 2) + '\n');
  if (problem || report?.error) {
    log.filter((l) => !l.startsWith('[chromium]')).forEach((l) => console.log(l));
  }
  return summarize(report, problem);
}

main().then(
  (status) => process.exit(status),
  (e) => {
    console.log(`FAIL  ${e.stack ?? e}`);
    console.log('0 passed, 1 failed');
    process.exit(1);
  },
);
