// The page: the chat and the dashboard as two views of one document (switching keeps a running
// reply going), and the colour scheme.
import { Chat } from './chat.js';
import { Dashboard } from './dashboard.js';

const THEME = 'sieve.theme';
const THEMES = ['auto', 'light', 'dark'];

function applyTheme(theme) {
  if (theme === 'auto') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  const b = document.getElementById('theme-toggle');
  b.title = `Colour scheme: ${theme === 'auto' ? 'automatic' : theme}`;
}

let chat = null;
let dashboard = null;

function show(view) {
  const dash = view === 'dashboard';
  document.getElementById('chat-view').hidden = dash;
  document.getElementById('dashboard-view').hidden = !dash;
  document.body.classList.toggle('view-dashboard', dash);
  for (const a of document.querySelectorAll('.tabs a')) {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = dash ? 'Sieve · Dashboard' : 'Sieve';
  if (dash) {
    dashboard ||= new Dashboard();
    dashboard.start();
  } else {
    dashboard?.stop();
    document.getElementById('input').focus();
  }
}

function route() {
  show(location.pathname.replace(/\/+$/, '') === '/dashboard' ? 'dashboard' : 'chat');
}

function init() {
  let theme = localStorage.getItem(THEME) || 'auto';
  applyTheme(theme);
  document.getElementById('theme-toggle').addEventListener('click', () => {
    theme = THEMES[(THEMES.indexOf(theme) + 1) % THEMES.length];
    localStorage.setItem(THEME, theme);
    applyTheme(theme);
  });
  for (const a of document.querySelectorAll('.tabs a')) {
    a.addEventListener('click', (ev) => {
      if (ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.button !== 0) return;
      ev.preventDefault();
      if (location.pathname !== a.getAttribute('href')) history.pushState(null, '', a.getAttribute('href'));
      route();
    });
  }
  window.addEventListener('popstate', route);
  chat = new Chat();
  window.sieveChat = chat;  // for the browser tests and the console
  route();
  chat.connect();
}

init();
