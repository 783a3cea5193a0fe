/** Bytes as people read them (1000-based, like Finder). */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return '—';
  if (bytes < 1000) return `${bytes} B`;
  const units = ['kB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let unit = -1;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit++;
  }
  return `${value >= 100 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

/** A Hugging Face repo id: "org/name". */
export function checkRepoId(text: string): string | null {
  const repo = text.trim();
  if (!repo) return 'Enter a Hugging Face repo id, like mlx-community/Qwen2.5-0.5B-Instruct-4bit.';
  if (!/^[A-Za-z0-9][\w.-]*\/[\w.-]+$/.test(repo)) return 'A repo id looks like org/name (letters, digits, “-”, “_”, “.”).';
  return null;
}
