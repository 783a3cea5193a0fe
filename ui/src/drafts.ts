/** Unsent text per conversation (-1: the welcome screen), kept while switching. */
export const drafts = new Map<number, string>();
