// Images the user attaches, pastes or drops in the composer, read into data URLs (checked for
// type and size first, as the server would).

/** What the server decodes (seedbar-images). */
export const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/webp', 'image/gif'];
/** The server's limit per image (20 MiB). */
export const MAX_IMAGE_BYTES = 20 * 1024 * 1024;
/** The server's limit per request. */
export const MAX_IMAGES = 16;

/** Why a file cannot be sent, or null when it can. */
export function refusal(file: { type: string; size: number; name?: string }): string | null {
  const name = file.name ? `${file.name}: ` : '';
  if (!IMAGE_TYPES.includes(file.type)) return `${name}send a PNG, JPEG, WebP or GIF image`;
  if (file.size > MAX_IMAGE_BYTES) return `${name}the image is over 20 MB`;
  return null;
}

/** The images among `files` as data URLs, and why the others were left out. */
export async function readImages(files: Iterable<File>): Promise<{ urls: string[]; refused: string[] }> {
  const urls: string[] = [];
  const refused: string[] = [];
  for (const file of files) {
    const why = refusal(file);
    if (why) {
      refused.push(why);
      continue;
    }
    urls.push(await new Promise<string>((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result));
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    }));
  }
  return { urls, refused };
}
