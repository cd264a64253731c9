-- The API's read-only role (README, "Database roles"). The owner role (POSTGRES_USER, vitals)
-- creates and migrates the schemas through the processor; the reader may only read them.
CREATE ROLE vitals_reader LOGIN PASSWORD 'vitals_reader';
ALTER DEFAULT PRIVILEGES FOR ROLE vitals GRANT USAGE ON SCHEMAS TO vitals_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE vitals GRANT SELECT ON TABLES TO vitals_reader;
