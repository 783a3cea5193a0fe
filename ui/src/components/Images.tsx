// Thumbnails: the images attached to the message being written, and those of a sent message.

import { useEffect, useState } from 'preact/hooks';
import { IconClose } from './icons';

/** Fetches a stored image; resolves with a URL the page can show. */
export type LoadImage = (id: number) => Promise<string>;

/** Stored images' URLs, fetched once per page. */
const shown = new Map<number, Promise<string>>();

function storedImageUrl(id: number, load: LoadImage): Promise<string> {
  let url = shown.get(id);
  if (!url) {
    url = load(id);
    url.catch(() => shown.delete(id));
    shown.set(id, url);
  }
  return url;
}

/** The composer's attached images, each with a button to take it off. */
export function AttachedImages({ urls, onRemove }: { urls: string[]; onRemove: (index: number) => void }) {
  if (urls.length === 0) return null;
  return (
    <div class="image-strip attached" data-testid="attached-images">
      {urls.map((url, k) => (
        <figure key={k} class="thumb">
          <img src={url} alt={`Attached image ${k + 1}`} data-testid="attached-image" />
          <button type="button" class="thumb-remove" aria-label={`Remove image ${k + 1}`} onClick={() => onRemove(k)}>
            <IconClose size={12} />
          </button>
        </figure>
      ))}
    </div>
  );
}

/** A sent message's images: stored ones by id (fetched with `load`), or a pending message's
 *  own data URLs. */
export function MessageImages({ ids, local, load }: { ids?: number[]; local?: string[]; load: LoadImage }) {
  const count = local?.length ?? ids?.length ?? 0;
  if (count === 0) return null;
  return (
    <div class="image-strip" data-testid="message-images">
      {local ? local.map((url, k) => <img key={k} class="thumb" src={url} alt={`Image ${k + 1}`} data-testid="message-image" />)
        : ids!.map((id, k) => <StoredImage key={id} id={id} index={k} load={load} />)}
    </div>
  );
}

function StoredImage({ id, index, load }: { id: number; index: number; load: LoadImage }) {
  const [url, setUrl] = useState<string | null>(null);
  const [failed, setFailed] = useState(false);
  useEffect(() => {
    let live = true;
    storedImageUrl(id, load).then((u) => live && setUrl(u), () => live && setFailed(true));
    return () => { live = false; };
  }, [id]);
  if (failed) return <span class="thumb missing" role="img" aria-label={`Image ${index + 1} could not be loaded`}>?</span>;
  return url ? <img class="thumb" src={url} alt={`Image ${index + 1}`} data-testid="message-image" data-image-id={id} />
    : <span class="thumb loading" role="img" aria-label={`Loading image ${index + 1}`} />;
}
