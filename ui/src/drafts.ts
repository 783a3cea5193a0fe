/** Unsent text per conversation (-1: the welcome screen), kept while switching. */
export const drafts = new Map<number, string>();

/** Unsent images per conversation, as data URLs, kept while switching. */
export const imageDrafts = new Map<number, string[]>();
