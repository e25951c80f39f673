"""Raw SEN12MS-CR-TS layout, GeoTIFF I/O, cloud detection, preparation and the prepared store."""
