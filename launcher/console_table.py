"""fleetrun's tables (the start table, the step summary): left-aligned columns, two spaces apart."""


def format_table(header, rows):
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in (header, *rows)]
