// Helpers for the browser tests: find the system's Chromium, load playwright-core (installed into
// tests/web/node_modules by scripts/setup; it never downloads a browser), open pages.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

// CTest's SKIP_RETURN_CODE for these tests.
export const SKIP = 77;

// The Chromium binary: $SIEVE_CHROMIUM, else the first of the usual places. null: none.
export function findChromium() {
  const candidates = [process.env.SIEVE_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser',
    '/usr/lib/chromium/chromium', '/usr/bin/google-chrome', '/usr/bin/google-chrome-stable'].filter(Boolean);
  return candidates.find((p) => {
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return true;
    } catch {
      return false;
    }
  }) || null;
}

export async function loadPlaywright() {
  const entry = path.join(here, 'node_modules', 'playwright-core', 'index.mjs');
  if (!fs.existsSync(entry)) {
    throw new Error(`playwright-core is not installed in ${path.join(here, 'node_modules')}: run scripts/setup ` +
      '(or `npm install` in tests/web)');
  }
  return import(pathToFileURL(entry).href);
}

// Chromium as root in a container needs --no-sandbox; the rest keeps it off the network, which a
// closed machine would refuse connection by connection.
export const CHROMIUM_FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-default-apps', '--disable-extensions', '--mute-audio'];

export async function launch(executablePath) {
  const { chromium } = await loadPlaywright();
  return chromium.launch({ executablePath, args: CHROMIUM_FLAGS, timeout: 120000 });
}

// A page that records its uncaught errors and console errors in `page.problems`.
export async function newPage(browser, options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, ...options });
  const page = await context.newPage();
  page.problems = [];
  page.on('pageerror', (e) => page.problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // A refused request (401 when testing the API key) is logged by the browser itself.
    if (m.type() === 'error' && !/status of 40[14]/.test(m.text())) page.problems.push(`console: ${m.text()}`);
  });
  page.setDefaultTimeout(30000);
  return page;
}
