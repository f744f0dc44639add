//! Swap on the node: whether it is on (the agent's failSwapOn check).

/// The first active swap area in `/proc/swaps` text (its file name), if any.
pub fn active_swap(proc_swaps: &str) -> Option<String> {
    proc_swaps
        .lines()
        .skip(1)
        .find_map(|l| l.split_whitespace().next().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_swaps() {
        let none = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        assert_eq!(active_swap(none), None);
        let one =
            format!("{none}/swapfile                               file\t\t1048572\t\t0\t\t-2\n");
        assert_eq!(active_swap(&one).as_deref(), Some("/swapfile"));
    }
}
