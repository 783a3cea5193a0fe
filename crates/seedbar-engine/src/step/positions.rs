//! Where a row's tokens sit for rotary embeddings. Most models rotate the token at sequence
//! index `s` by `s`. A model with multimodal RoPE (Qwen2-VL's M-RoPE) rotates by three
//! positions, (time, row, column), each over its own section of the rotated pairs: a text
//! token has all three equal, an image's tokens lie on the image's grid of merged patches
//! (time fixed, row and column from where the grid starts), and the text after an image
//! continues one past the grid's largest position, so later text is shifted by what the
//! image saved. A row's positions are a function of its own tokens and images.

use std::sync::Arc;

/// An image's tokens in a row: `rows × cols` merged patches, row by row, from sequence
/// index `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGrid {
    pub at: usize,
    pub rows: usize,
    pub cols: usize,
}

impl ImageGrid {
    fn tokens(&self) -> usize {
        self.rows * self.cols
    }

    /// How much further the text after the image starts than its sequence index: the grid
    /// advances positions by its longer side, not by its token count.
    fn shift(&self) -> i64 {
        self.rows.max(self.cols) as i64 - self.tokens() as i64
    }
}

/// A row's rotary positions: its images' grids in prompt order (none: position = index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowPositions {
    grids: Arc<[ImageGrid]>,
}

impl RowPositions {
    /// The positions of a row whose images lie on `grids` (sorted here by `at`; they must
    /// not overlap).
    pub fn new(mut grids: Vec<ImageGrid>) -> RowPositions {
        grids.sort_by_key(|g| g.at);
        RowPositions {
            grids: grids.into(),
        }
    }

    /// Whether every token's position is its sequence index.
    pub fn is_plain(&self) -> bool {
        self.grids.is_empty()
    }

    /// The (time, row, column) position of the token at sequence index `s`.
    pub fn at(&self, s: usize) -> [i32; 3] {
        let mut shift = 0i64;
        for grid in self.grids.iter() {
            if s < grid.at {
                break;
            }
            let k = s - grid.at;
            if k < grid.tokens() {
                let start = grid.at as i64 + shift;
                let (row, col) = ((k / grid.cols) as i64, (k % grid.cols) as i64);
                return [start, start + row, start + col].map(|p| p as i32);
            }
            shift += grid.shift();
        }
        [(s as i64 + shift) as i32; 3]
    }

    /// Where the text token at sequence index `s` and those after it up to the next image
    /// rotate, as `s` plus this; `None` where `s..end` holds an image token (a chunk over
    /// them needs each position: [`at`](Self::at)).
    pub fn text_shift(&self, s: usize, end: usize) -> Option<i32> {
        let mut shift = 0i64;
        for grid in self.grids.iter() {
            if grid.at >= end {
                break;
            }
            if grid.at + grid.tokens() > s {
                return None;
            }
            shift += grid.shift();
        }
        Some(shift as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mlx-vlm's `get_rope_index` for text, a 2x3 image, text, a 1x2 image, text.
    #[test]
    fn positions_follow_qwen2_vl_rope_index() {
        let positions = RowPositions::new(vec![
            ImageGrid {
                at: 13,
                rows: 1,
                cols: 2,
            },
            ImageGrid {
                at: 2,
                rows: 2,
                cols: 3,
            },
        ]);
        let all: Vec<[i32; 3]> = (0..17).map(|s| positions.at(s)).collect();
        let expected = [
            [0, 0, 0],
            [1, 1, 1],
            // The first image from index 2: rows 2..4, columns 2..5.
            [2, 2, 2],
            [2, 2, 3],
            [2, 2, 4],
            [2, 3, 2],
            [2, 3, 3],
            [2, 3, 4],
            // Text one past the largest (4): index 8 at 5, a shift of -3.
            [5, 5, 5],
            [6, 6, 6],
            [7, 7, 7],
            [8, 8, 8],
            [9, 9, 9],
            // The second image from index 13 (position 10): shift -3 + (2 - 2).
            [10, 10, 10],
            [10, 10, 11],
            [12, 12, 12],
            [13, 13, 13],
        ];
        assert_eq!(all, expected);
        assert_eq!(positions.text_shift(0, 2), Some(0));
        assert_eq!(positions.text_shift(1, 3), None);
        assert_eq!(positions.text_shift(8, 13), Some(-3));
        assert_eq!(positions.text_shift(15, 40), Some(-3));
        assert!(RowPositions::default().is_plain());
        assert_eq!(RowPositions::default().at(7), [7; 3]);
    }
}
