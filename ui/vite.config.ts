/// <reference types="vitest/config" />
import { defineConfig } from 'vite';

declare const process: { env: Record<string, string | undefined> };

// Relative asset paths: the same dist/ is served by `seedbar serve --ui-dir` at / and
// loaded by the Tauri shell from its bundled frontend folder.
export default defineConfig({
  base: './',
  oxc: {
    jsx: { runtime: 'automatic', importSource: 'preact' },
  },
  // `npm run dev`: the page's own origin proxies /app to a running `seedbar serve`
  // (SEEDBAR_API, default the app's port 7337; `npm run mock` listens on 7338).
  server: {
    proxy: { '/app': { target: process.env.SEEDBAR_API ?? 'http://127.0.0.1:7337', changeOrigin: true } },
  },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: false,
    reportCompressedSize: true,
    // Two pages: the chat window and the quick-chat panel.
    rollupOptions: { input: { main: 'index.html', quick: 'quick.html' } },
  },
  test: {
    environment: 'node',
    include: ['test/**/*.test.ts', 'test/**/*.test.tsx'],
  },
});
