/* tests/unit/doc_table.h — reads a state × event table of docs/SYNC.md
 * (the tests run from the repo root), for the state-machine tests that
 * hold the doc to the code (test_coord_sm.c, test_sink_sm.c,
 * test_pair_sm.c, test_reader_sm.c).
 *
 * doc_table_read() finds the first line starting with `head` (the table's
 * header row), skips the |---| line and returns the body rows, each cell
 * trimmed of the spaces around it: cell[r][0] is the row's name, then one
 * cell per column.  Every row must have `ncols` cells after its name.
 * Returns the number of rows, -1 when the file cannot be read (the caller
 * skips), -2 when no such table is there, -3 when a row has another
 * number of cells (*bad names it). */
#ifndef DTED_TEST_DOC_TABLE_H
#define DTED_TEST_DOC_TABLE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DOC_TABLE_ROWS 32
#define DOC_TABLE_COLS 32
#define DOC_TABLE_CELL 96

struct doc_table {
	char cell[DOC_TABLE_ROWS][DOC_TABLE_COLS + 1][DOC_TABLE_CELL];
	char bad[256];
};

static inline void doc_table_trim(char *dst, const char *src, size_t len)
{
	size_t n;

	while (*src == ' ')
		src++;
	n = strlen(src);
	while (n && (src[n - 1] == ' ' || src[n - 1] == '\n'))
		n--;
	if (n >= len)
		n = len - 1;
	memcpy(dst, src, n);
	dst[n] = 0;
}

static inline int doc_table_read(const char *path, const char *head, int ncols,
				 struct doc_table *t)
{
	FILE *f = fopen(path, "r");
	char line[8192];
	int in = 0, rows = 0;

	if (!f)
		return -1;
	memset(t, 0, sizeof(*t));
	while (fgets(line, sizeof(line), f)) {
		char *p = line, *bar;
		int n = 0;

		if (!in) {
			in = !strncmp(line, head, strlen(head));
			continue;
		}
		if (line[0] != '|')
			break;
		if (!strncmp(line, "|---", 4))
			continue;
		if (rows == DOC_TABLE_ROWS || ncols > DOC_TABLE_COLS) {
			fclose(f);
			snprintf(t->bad, sizeof(t->bad), "too many rows or columns");
			return -3;
		}
		p++;	/* the leading '|' */
		while ((bar = strchr(p, '|'))) {
			*bar = 0;
			if (n <= ncols)
				doc_table_trim(t->cell[rows][n], p, DOC_TABLE_CELL);
			n++;
			p = bar + 1;
		}
		if (n != ncols + 1) {
			fclose(f);
			snprintf(t->bad, sizeof(t->bad), "row %d (%s): %d cells, want %d", rows,
				 t->cell[rows][0], n, ncols + 1);
			return -3;
		}
		rows++;
	}
	fclose(f);
	return in ? rows : -2;
}

#endif
