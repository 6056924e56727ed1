"""How results show themselves: self-contained HTML pieces shared by the report and notebooks."""
