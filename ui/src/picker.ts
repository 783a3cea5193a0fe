// Choosing a model on disk: in the Tauri window a native file picker (the shell's
// `pick_model_path` command, tauri-plugin-dialog); in a plain browser there is none, and the
// library asks for a path instead.

declare global {
  interface Window {
    __TAURI_INTERNALS__?: { invoke: (command: string, args?: Record<string, unknown>) => Promise<unknown> };
  }
}

/** Whether a native file picker is there (the app's own window). */
export function hasNativePicker(): boolean {
  return typeof window !== 'undefined' && !!window.__TAURI_INTERNALS__;
}

/** Asks for a `.gguf` file (or, with `folder`, a model folder); null when cancelled. */
export async function pickModelPath(folder: boolean): Promise<string | null> {
  const picked = await window.__TAURI_INTERNALS__!.invoke('pick_model_path', { folder });
  return typeof picked === 'string' && picked ? picked : null;
}
